"""The inputs of ``bench/fuzz.py`` (rule 2 of its docstring): what each
fuzzing connection writes to the node.

1. ``Fuzzer.connection(phase)`` makes one connection's inputs for a phase
   (``client``, ``stranger``, ``peer-stranger``, ``peer-member``): its
   kind, the side whose protocol the answers speak, and the inputs, the
   first with the preamble.
2. Bodies come from ``overlay.testing.Mutator`` over one valid message of
   every type (``overlay.testing.samples``) or from the corpus: mutated
   messages, valid ones out of order, byte-level mutations of valid frames.
3. ``Fuzzer.keep`` adds an input whose answer was a new behaviour to the
   corpus, mutated again later; the corpus is bounded in number
   (``CORPUS_MAX``) and each input in size (``CORPUS_INPUT_MAX``), kept
   packed (few objects for the GC).
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from overlay.config import ClusterConfig
from overlay.messages import client as cm
from overlay.messages import peer as pm
from overlay.messages.codec import HEADER, encode
from overlay.net.node import CLIENT_MAGIC, PEER_MAGIC
from overlay.testing import Mutator, samples

# Inputs one connection carries (a few: the first bad frame usually ends it).
PER_CONNECTION: Final = 6
# The corpus of inputs with a new behaviour, mutated again: bounded, in number and size.
CORPUS_MAX: Final = 4_000
CORPUS_INPUT_MAX: Final = 16 * 1024
# Node ids no config has; the member's hello carries no address, so it is not a join.
# A pool, used in turn: a node refuses a second live link of one id (duplicate_id).
STRANGER_ID: Final = 4242
MEMBER_IDS: Final = 64


@dataclass
class Input:
    kind: str
    data: bytes  # what is written, the preamble included
    tree: Any = None  # the mutated message, when one is to be kept
    needs_answer: bool = True


class Fuzzer:
    """The inputs (rule 2 of ``fuzz.py``'s docstring) over one node's schema."""

    def __init__(self, rng: random.Random, config: ClusterConfig, token: str) -> None:
        self.rng = rng
        self.config = config
        self.m = Mutator(rng, max_size=config.cluster.max_frame_size)
        self.client, self.peer = samples(config.schema, node=0, peer=STRANGER_ID)
        self.cluster = config.cluster.name
        self.token = token
        self.corpus: dict[str, list[bytes]] = {"client": [], "peer": []}
        self.incarnations = itertools.count(1)
        self.member_ids = itertools.cycle(range(STRANGER_ID, STRANGER_ID + MEMBER_IDS))
        self.member_id = STRANGER_ID  # the id of the member connection made last

    # -- bodies -------------------------------------------------------------------------------------

    def _frame(self, body: bytes) -> bytes:
        return HEADER.pack(len(body)) + body

    def _mutated(self, side: str) -> tuple[bytes, Any, str]:
        """A mutated message body of one side, from a sample or the corpus."""
        donors = self.client if side == "client" else self.peer
        corpus = self.corpus[side]
        if corpus and self.rng.random() < 0.4:
            tree = msgspec.msgpack.decode(self.rng.choice(corpus))  # kept packed: few objects for the GC
            for _ in range(self.rng.choice((1, 1, 2))):
                tree = self.m.mutate(tree, donors)
            kind = "corpus"
        else:
            tree = self.m.tree(self.rng.choice(donors), donors)
            kind = "mutated"
        body = self.m.encode(tree)
        if len(body) > self.m.max_size:  # cut to one frame: the oversize prefix has inputs of its own
            return body[: self.m.max_size], None, kind
        # Only small inputs are kept to mutate again: copying a large one (a grown
        # list of a million items) held the fuzzer's loop for seconds.
        return body, tree if len(body) <= CORPUS_INPUT_MAX else None, kind

    def _valid(self, side: str) -> bytes:
        if side == "client":
            return encode(self.rng.choice(self.client))
        return encode(self.rng.choice(self.peer))

    def frames(self, side: str, n: int) -> list[Input]:
        """``n`` inputs of one side: mutated messages (60 %), valid ones in
        whatever order they come — out of order on purpose (20 %), and
        byte-level mutations of valid frames (20 %)."""
        out = []
        for _ in range(n):
            r = self.rng.random()
            if r < 0.6:
                body, tree, kind = self._mutated(side)
                out.append(Input(kind, self._frame(body), tree))
            elif r < 0.8:
                out.append(Input("valid-out-of-order", self._frame(self._valid(side)), needs_answer=False))
            else:
                bodies = [self._valid(side) for _ in range(self.rng.randrange(1, 3))]
                # A frame cut short waits for its end: no answer is due, and
                # what followed would be read as its rest — the connection's last input.
                out.append(Input("bytes", self.m.frames(bodies), needs_answer=False))
                break
        return out

    # -- connections ---------------------------------------------------------------------------------

    def hello(self, token: str) -> bytes:
        # A token names its client: the Hello must name the same one.
        client_id = "fuzz" if token == self.token and token else f"fuzz-{self.rng.randrange(1 << 30)}"
        return self._frame(encode(cm.Hello(client_id, 1, token)))

    def peer_hello(self) -> bytes:
        hello = pm.PeerHello(self.member_id, self.cluster, False, incarnation=next(self.incarnations))
        return self._frame(encode(hello))

    def connection(self, phase: str) -> tuple[str, str, list[Input]]:
        """One connection: its kind, its side (the protocol its answers
        speak) and its inputs, the first with the preamble."""
        r = self.rng
        if phase == "client":
            token = self.token if r.random() < 0.8 else ""
            first = Input("hello", CLIENT_MAGIC + self.hello(token), needs_answer=True)
            kind = "client-token" if token else "client-anonymous"
            return kind, "client", [first, *self.frames("client", PER_CONNECTION)]
        if phase == "stranger":
            k = r.randrange(4)
            if k == 0:  # no Hello: the first frame is anything
                inputs = self.frames("client", PER_CONNECTION)
                inputs[0].data = CLIENT_MAGIC + inputs[0].data
                return "client-no-hello", "client", inputs
            if k == 1:  # a tampered token
                chars = list(self.token or "x.y.z")
                for _ in range(r.choice((1, 3))):
                    chars[r.randrange(len(chars))] = r.choice("AZaz09-_.")
                first = Input("tampered-token", CLIENT_MAGIC + self.hello("".join(chars)))
                return "client-bad-token", "client", [first, *self.frames("client", 2)]
            if k == 2:  # a random token
                first = Input("random-token", CLIENT_MAGIC + self.hello(r.randbytes(r.randrange(200)).hex()))
                return "client-bad-token", "client", [first, *self.frames("client", 2)]
            preamble = r.choice([r.randbytes(4), CLIENT_MAGIC, PEER_MAGIC, b"OVC2", b"\x00\x00\x00\x00"])
            side = "peer" if preamble == PEER_MAGIC else "client"
            data = preamble + r.randbytes(r.choice((0, 1, 7, 100, 4096)))
            known = preamble in (CLIENT_MAGIC, PEER_MAGIC)  # then the bytes may be a frame cut short
            return "raw-bytes", side, [Input("random-bytes", data, needs_answer=not known)]
        if phase == "peer-stranger":  # no proof of the cluster secret: refused, whatever it says
            k = r.randrange(3)
            if k == 0:  # a proper hello, as a node that never proved anything
                claim = r.choice([STRANGER_ID, 0, 1])
                hello = pm.PeerHello(claim, self.cluster, True, incarnation=next(self.incarnations))
                first = Input("hello-unproven", PEER_MAGIC + self._frame(encode(hello)))
                return "peer-stranger", "peer", [first, *self.frames("peer", 2)]
            if k == 1:  # the challenge opened, then a proof that is not one
                auth = pm.PeerAuth(r.choice([STRANGER_ID, 0]), self.cluster, r.randbytes(16))
                proof = pm.PeerProof(r.randbytes(32))
                data = PEER_MAGIC + self._frame(encode(auth)) + self._frame(encode(proof))
                return "peer-stranger", "peer", [Input("bad-proof", data), *self.frames("peer", 2)]
            inputs = self.frames("peer", PER_CONNECTION)
            inputs[0].data = PEER_MAGIC + inputs[0].data
            return "peer-stranger", "peer", inputs
        # A member: the link opened and proved (dial_peer), then a hello and anything.
        self.member_id = next(self.member_ids)
        if r.random() < 0.8:
            first = Input("peer-hello", self.peer_hello())
        else:
            body, tree, _ = self._mutated("peer")
            first = Input("mutated-hello", self._frame(body), tree)
        inputs = self.frames("peer", PER_CONNECTION)
        for inp in inputs:
            inp.needs_answer = False  # peers are not answered message by message
        return "peer-member", "peer", [first, *inputs]

    def keep(self, side: str, tree: Any) -> None:
        corpus = self.corpus[side]
        packed = self.m.encode(tree)
        if len(corpus) < CORPUS_MAX:
            corpus.append(packed)
        else:
            corpus[self.rng.randrange(CORPUS_MAX)] = packed
