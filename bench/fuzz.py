"""A bounded mutational fuzz run against a live node (issue 17 item 5, SPEC §9, §16).

Run as ``flock /tmp/bench.lock .venv/bin/python bench/fuzz.py [--seconds S]
[--inputs N] [--seed K] [--workers W] [--no-auth] [--no-coverage]
[--rss-growth MB] [--logs DIR]`` (the lock: never two benchmarks at once on
the machine).  Default: 240 s, at most 200,000 inputs; exit status 0 when
no check failed.

This file holds the command line, the fuzzing connections, the checks while
it runs and the report; next to it, ``fuzz_inputs.py`` holds the inputs (the
``Fuzzer``), ``fuzz_target.py`` the node under fuzz (its config, tokens,
process, status, RSS, coverage arcs and log), and ``fuzz_node.py`` the
wrapper that runs it under coverage.

What it does:

1. **The node.**  One ``overlay node`` process (``overlay.testing.NodeProcesses``,
   a one-node cluster on a free loopback port, its log at ``info``) with
   ``[auth]`` (a key pair made for the run; ``--no-auth``: none), run under
   ``coverage`` by ``bench/fuzz_node.py`` (branch arcs of ``overlay``,
   saved when it stops) unless ``--no-coverage``.  A baseline run first (start, the control traffic
   below for a few seconds, stop) gives the arcs any run reaches, so the
   report can say what the fuzz inputs reached beyond them.
2. **Inputs**, from ``overlay.testing.Mutator`` over one valid message of
   every type (``overlay.testing.samples``), on ``--workers`` concurrent
   connections, each carrying a few inputs, in four phases:

   * ``client`` — a Hello (with a valid token when ``[auth]`` is on, so the
     requests reach the node core; without one on a fifth of them), then
     client messages with mutated fields, valid ones in a random order
     (Unsubscribe before Subscribe, Ack of nothing), and byte-level
     mutations (cut short, bits flipped, a rewritten length prefix, an
     oversize prefix, garbage, a nesting past the decoder's depth limit);
   * ``stranger`` — a client connection without a Hello, a Hello with a
     tampered or random token, random bytes after any 4-byte preamble;
   * ``peer-stranger`` — the peer preamble without the proof of the
     cluster's secret (the harness runs plain TCP with a secret,
     ``overlay.testing.insecure_tls``): a proper PeerHello claiming a new
     id or a member's, a challenge opened and then a false proof, or
     anything; each must be refused and change nothing;
   * ``peer-member`` — a link opened and proved as a node does
     (``overlay.testing.dial_peer``), a proper PeerHello from a new node id
     without an address (so not a join) or a mutated one, then peer
     messages with mutated fields and valid ones out of order (a Reforward
     for an unknown session, a CompleteLoadBalance from a non-participant,
     a SubscriptionMove before any ChannelTransfer …).

   The fuzzer keeps an input whose answer (the types and error codes the
   node sent back, whether it closed the connection, the first words of its
   error) was not seen before, and mutates those again: guided by distinct
   behaviours, not by coverage.
3. **Checks while it runs.**  Every connection gets an answer or is closed
   within ``ANSWER_SECONDS`` (an input that needs no answer — a valid peer
   message — may get none).  A control client (its own valid token)
   subscribes and publishes every ``CONTROL_EVERY`` s and must receive each
   event within ``CONTROL_TIMEOUT``.  The node's RSS is sampled every
   second and may grow at most ``--rss-growth`` MB over its value after the
   warm-up.  The process must never exit.
4. **Report.**  Inputs tried per phase and kind, distinct behaviours, the
   error codes and close reasons seen, the node's counters of refused
   input, coverage (arcs reached, and those the baseline did not reach),
   the control rounds (on time / late / lost), RSS, and every Traceback in
   the node's log with the line that introduced it.

What fails the run: the process died; an RSS growth past the bound; a
Traceback in the log (none is acceptable: every handled bad input is
logged as one line, without a traceback); a connection neither answered
nor closed; a control event lost or late in a phase other than
``peer-member``.  In ``peer-member`` the control traffic is reported, not
judged: a node trusts what a proved member tells it about its own channels
and tables (a valid UpdateRoutingTable may re-point a channel, a
RoutingTableInit of another epoch may replace the table) — SPEC §16 keeps
strangers out, it does not make members' words safe; the content a
member's message carries is checked (``overlay.node.peer_checks``).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import random
import re
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from fuzz_inputs import Fuzzer
from fuzz_target import arcs_of, ready, rss_of, start, status, token_for, tracebacks, write_config
from overlay.client import Client
from overlay.config import load_config
from overlay.errors import OverlayError, RemoteProtocolError
from overlay.messages import client as cm
from overlay.messages import peer as pm
from overlay.messages.codec import client_reader, peer_reader
from overlay.net.node import CLIENT_MAGIC
from overlay.testing import NodeProcesses, dial_peer, free_ports

# An answer or a close within this many seconds of a connection's last input.
ANSWER_SECONDS: Final = 3.0
# A connection the node has not accepted by then: a hang (the machine is shared, so generous).
CONNECT_SECONDS: Final = 10.0
# How long to look for an answer nobody owes (a valid peer message, a frame cut short).
NO_ANSWER_WAIT: Final = 0.05
# Quiet time after which a connection's answer is taken as complete.
QUIET_SECONDS: Final = 0.15
# The control client publishes this often and must get each event within the timeout.
CONTROL_EVERY: Final = 0.5
CONTROL_TIMEOUT: Final = 5.0
# The phases and their share of the run.
PHASES: Final = (("client", 0.35), ("stranger", 0.15), ("peer-stranger", 0.15), ("peer-member", 0.35))
JUDGED: Final = frozenset({"client", "stranger", "peer-stranger"})
WARMUP_SECONDS: Final = 3.0
BASELINE_SECONDS: Final = 5.0
_DIGITS: Final = re.compile(r"\d+(\.\d+)?")


# -- the run's records ------------------------------------------------------------------------------


@dataclass
class Stats:
    inputs: collections.Counter[tuple[str, str]] = field(default_factory=collections.Counter)
    connections: collections.Counter[str] = field(default_factory=collections.Counter)
    answers: collections.Counter[str] = field(default_factory=collections.Counter)  # error codes, close reasons
    behaviours: set[tuple[Any, ...]] = field(default_factory=set)
    unanswered: list[str] = field(default_factory=list)
    control: dict[str, collections.Counter[str]] = field(
        default_factory=lambda: collections.defaultdict(collections.Counter)
    )
    rss: list[tuple[float, int]] = field(default_factory=list)
    died: str = ""
    connect_max: float = 0.0
    gen_max: tuple[float, str] = (0.0, "")  # the slowest input generation (the fuzzer's own time)
    lag_max: float = 0.0  # the fuzzer's event loop, late by this much at most
    growth: list[tuple[float, int]] = field(default_factory=list)  # (s, behaviours)


# -- one connection --------------------------------------------------------------------------------


def _words(text: str) -> str:
    return " ".join(_DIGITS.sub("N", text).split()[:4])


async def _read_answer(
    reader: asyncio.StreamReader, side: str, deadline: float, first: float
) -> tuple[list[Any], bool]:
    """What the node sent back until it went quiet (``first`` s for the
    first byte, then ``QUIET_SECONDS``) or closed: (messages, closed)."""
    frames = client_reader(1 << 24) if side == "client" else peer_reader(1 << 24)
    out: list[Any] = []
    started = False
    buf = b""
    while True:
        wait = max(0.01, min(QUIET_SECONDS if out or started else first, deadline - time.monotonic()))
        try:
            data = await asyncio.wait_for(reader.read(1 << 16), wait)
        except TimeoutError:
            return out, False
        except OSError:
            return out, True
        if not data:
            return out, True
        started = True
        if side == "client" and not buf and data[:4] == CLIENT_MAGIC:
            data = data[4:]
        buf = b"x"
        with contextlib.suppress(RemoteProtocolError):
            out += frames.feed(data)
        if time.monotonic() > deadline:
            return out, False


def _signature(phase: str, kind: str, msgs: list[Any], closed: bool) -> tuple[Any, ...]:
    parts: list[Any] = []
    for m in msgs:
        if isinstance(m, cm.Error):
            parts.append(("Error", m.code, m.fatal, _words(m.message)))
        elif isinstance(m, pm.PeerError):
            parts.append(("PeerError", m.code, _words(m.message)))
        elif not isinstance(m, (pm.LinkAck, cm.Welcome, pm.PeerHello)):
            parts.append(type(m).__name__)
    return (phase, kind, tuple(sorted(set(map(str, parts)))), closed)


async def one_connection(fz: Fuzzer, phase: str, addr: tuple[str, int], st: Stats) -> None:
    t_gen = time.monotonic()
    conn_kind, side, inputs = fz.connection(phase)
    gen = time.monotonic() - t_gen
    if gen > st.gen_max[0]:
        st.gen_max = (
            gen,
            f"{phase}/{conn_kind}: {[i.kind for i in inputs]}, {sum(len(i.data) for i in inputs):,} bytes",
        )
    st.connections[conn_kind] += 1
    try:
        t0 = time.monotonic()
        if conn_kind == "peer-member":  # the preamble and the proof of the cluster secret, as a node does
            opening = dial_peer(fz.config, fz.member_id, 0)
        else:
            opening = asyncio.open_connection(*addr)
        reader, writer = await asyncio.wait_for(opening, CONNECT_SECONDS)
        st.connect_max = max(st.connect_max, time.monotonic() - t0)
    except (OSError, TimeoutError, OverlayError) as exc:
        st.unanswered.append(f"{phase}/{conn_kind}: connect failed: {exc!r}")
        return
    try:
        closed = False
        for inp in inputs:
            st.inputs[(phase, inp.kind)] += 1
            try:
                writer.write(inp.data)
                await asyncio.wait_for(writer.drain(), ANSWER_SECONDS)
            except (OSError, TimeoutError):
                closed = True
            deadline = time.monotonic() + ANSWER_SECONDS
            first = ANSWER_SECONDS if inp.needs_answer else NO_ANSWER_WAIT
            msgs, closed2 = await _read_answer(reader, side, deadline, first) if not closed else ([], True)
            closed = closed or closed2
            for m in msgs:
                if isinstance(m, cm.Error):
                    st.answers[f"error {m.code}{' (fatal)' if m.fatal else ''}"] += 1
                elif isinstance(m, pm.PeerError):
                    st.answers[f"peer_error {m.code}"] += 1
            answered = [m for m in msgs if not isinstance(m, pm.LinkAck)]
            if not answered and not closed and inp.needs_answer and not _silent_ok(inp.data):
                st.unanswered.append(f"{phase}/{conn_kind}/{inp.kind}: {inp.data[:80].hex()}")
            sig = _signature(phase, inp.kind, msgs, closed)
            if sig not in st.behaviours:
                st.behaviours.add(sig)
                if inp.tree is not None:
                    fz.keep("client" if side == "client" else "peer", inp.tree)
            if closed:
                st.answers["closed by the node"] += 1
                break
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()


def _silent_ok(data: bytes) -> bool:
    """A client frame the node need not answer: an Ack (counted), or a
    message only a node sends (Welcome, Notify …), which it ignores."""
    with contextlib.suppress(RemoteProtocolError):
        msgs = client_reader(1 << 30).feed(data[4:] if data[:4] == CLIENT_MAGIC else data)
        return all(
            isinstance(
                m,
                (
                    (
                        cm.Ack,
                        cm.Welcome,
                        cm.PubAck,
                        cm.PubAcks,
                        cm.SubAck,
                        cm.UnsubAck,
                        cm.Notify,
                        cm.Choke,
                        cm.Revoke,
                        cm.Error,
                        cm.AdminReply,
                    ),
                    cm.Hello,
                ),
            )
            for m in msgs
        )
    return False


# -- checks while it runs -------------------------------------------------------------------------------


async def control(addr: tuple[str, int], token: str, st: Stats, phase: list[str], stop: asyncio.Event) -> None:
    """Rule 3: a subscriber and a publisher of their own, every CONTROL_EVERY s."""

    def told(exc: OverlayError) -> None:  # e.g. a group a fuzz input made has no instance left: counted
        st.control[phase[0]][f"told: {getattr(exc, 'code', type(exc).__name__)}"] += 1

    c = await Client([addr], client_id="control", token=token, reconnect=True, error_cb=told).connect(timeout=10)
    try:
        sub = await c.subscribe("price < 1000", sub_id="control")
        n = 0
        while not stop.is_set():
            n += 1
            at = phase[0]
            t0 = time.monotonic()
            try:
                eid = await c.publish({"price": 1.0, "sym": "CTL", "qty": n}, timeout=CONTROL_TIMEOUT)
                while True:
                    left = CONTROL_TIMEOUT - (time.monotonic() - t0)
                    note = await sub.next(max(0.01, left))
                    if note.event_id == eid:
                        break
                st.control[at]["on time"] += 1
            except (TimeoutError, OverlayError, OSError) as exc:
                st.control[at][f"lost ({type(exc).__name__})"] += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), CONTROL_EVERY)
    finally:
        with contextlib.suppress(Exception):  # the node may be gone: the report says so
            await c.close()


async def watch(procs: NodeProcesses, st: Stats, stop: asyncio.Event, t0: float) -> None:
    pid = procs.procs[0].pid
    while not stop.is_set():
        if not procs.alive(0):
            st.died = f"exited with {procs.procs[0].returncode} after {time.monotonic() - t0:.0f}s"
            stop.set()
            return
        with contextlib.suppress(OSError):
            st.rss.append((time.monotonic() - t0, rss_of(pid)))
        st.growth.append((time.monotonic() - t0, len(st.behaviours)))
        tick = time.monotonic()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)
        st.lag_max = max(st.lag_max, time.monotonic() - tick - 1.0)


# -- the run -------------------------------------------------------------------------------------------


async def baseline(workdir: Path, config: Path, port: int, token: str) -> set[tuple[str, int, int]]:
    """Rule 1: what a run reaches with the control traffic alone."""
    cov = workdir / "baseline.coverage"
    procs = start(workdir, config, port, cov, "baseline")
    try:
        await ready(procs, token)
        st, stop = Stats(), asyncio.Event()
        task = asyncio.create_task(control(procs.addr(0), token, st, ["baseline"], stop))
        await asyncio.sleep(BASELINE_SECONDS)
        stop.set()
        await task
    finally:
        procs.stop()
    return arcs_of(cov)


async def run(args: argparse.Namespace, workdir: Path) -> tuple[Stats, dict[str, Any], dict[str, Any]]:
    (port,) = free_ports(1)
    config = write_config(workdir, port, args.auth)
    token = token_for(config, "fuzz")
    control_token = token_for(config, "control")
    info: dict[str, Any] = {"config": str(config), "auth": args.auth}
    base = await baseline(workdir, config, port, control_token) if args.coverage else set()
    cov = workdir / "fuzz.coverage" if args.coverage else None
    procs = start(workdir, config, port, cov, "fuzz")
    st = Stats()
    final: dict[str, Any] = {}
    try:
        await ready(procs, control_token)
        rng = random.Random(args.seed)
        fz = Fuzzer(rng, load_config(config), token)
        stop = asyncio.Event()
        phase = ["warm-up"]
        t0 = time.monotonic()
        watcher = asyncio.create_task(watch(procs, st, stop, t0))
        ctl = asyncio.create_task(control(procs.addr(0), control_token, st, phase, stop))
        await asyncio.sleep(WARMUP_SECONDS)
        info["rss_after_warmup"] = rss_of(procs.procs[0].pid)
        addr = procs.addr(0)
        budget = args.seconds - WARMUP_SECONDS
        for name, share in PHASES:
            phase[0] = name
            end = time.monotonic() + budget * share
            limit = args.inputs * share

            def tried(name: str = name) -> int:
                return sum(n for (p, _), n in st.inputs.items() if p == name)

            async def worker(name: str = name, end: float = end, limit: float = limit) -> None:
                while time.monotonic() < end and tried() < limit and not stop.is_set():
                    await one_connection(fz, name, addr, st)

            await asyncio.gather(*(worker() for _ in range(args.workers)))
            await asyncio.sleep(1.0)  # the control traffic of this phase's end
            if stop.is_set():
                break
        phase[0] = "end"
        with contextlib.suppress(OSError, OverlayError, TimeoutError):
            final = await status(procs, control_token)
        stop.set()
        await asyncio.gather(watcher, ctl, return_exceptions=True)
        info["elapsed"] = time.monotonic() - t0
        info["alive_at_end"] = procs.alive(0)
    finally:
        procs.stop()
    info["log"] = procs.log(0)
    if cov is not None and cov.exists():
        arcs = arcs_of(cov)
        info["arcs"] = len(arcs)
        info["arcs_beyond_baseline"] = len(arcs - base)
        info["baseline_arcs"] = len(base)
        info["files_beyond"] = collections.Counter(f for f, _, _ in arcs - base).most_common(12)
    return st, info, final


# -- the report --------------------------------------------------------------------------------------


def report(st: Stats, info: dict[str, Any], final: dict[str, Any], args: argparse.Namespace) -> bool:
    ok = True
    n_inputs = sum(st.inputs.values())
    print(
        f"fuzz run: {n_inputs:,} inputs on {sum(st.connections.values()):,} connections in {info.get('elapsed', 0):.0f} s"
    )
    print(f"  [auth] {'on' if info['auth'] else 'off'}; seed {args.seed}; {args.workers} workers")
    by_phase: collections.Counter[str] = collections.Counter()
    for (ph, _), n in st.inputs.items():
        by_phase[ph] += n
    for ph, _ in PHASES:
        kinds = ", ".join(f"{k} {n:,}" for (p, k), n in sorted(st.inputs.items()) if p == ph)
        print(f"  {ph:13s} {by_phase[ph]:7,}  ({kinds})")
    print("  connections: " + ", ".join(f"{k} {n:,}" for k, n in st.connections.most_common()))
    print(f"distinct behaviours (answer types, error codes and first words, closed or not): {len(st.behaviours):,}")
    if st.growth:
        marks = [st.growth[int(i * (len(st.growth) - 1) / 4)] for i in range(5)]
        print("  over time: " + ", ".join(f"{t:.0f}s {n}" for t, n in marks))
    print("answers: " + ", ".join(f"{k} {n:,}" for k, n in st.answers.most_common()))
    counters = final.get("stats", {})
    refused = {
        k: v for k, v in sorted(counters.items()) if k.startswith(("rejected", "refused", "unauthorized", "shell_"))
    }
    if refused:
        print("node counters: " + ", ".join(f"{k} {v:,}" for k, v in refused.items()))
    if "arcs" in info:
        print(
            f"coverage (branch arcs of overlay in the node process): {info['arcs']:,} reached, "
            f"{info['arcs_beyond_baseline']:,} beyond the {info['baseline_arcs']:,} of a run with control traffic only"
        )
        print(
            "  beyond the baseline, by file: "
            + ", ".join(f"{f.removeprefix('overlay/')} {n}" for f, n in info["files_beyond"])
        )
    for ph in ["warm-up", *(p for p, _ in PHASES), "end"]:
        if ph in st.control:
            c = st.control[ph]
            bad = sum(n for k, n in c.items() if k.startswith("lost"))
            judged = ph in JUDGED or ph == "warm-up"
            verdict = (
                "" if not bad else (" ← FAIL" if judged else " (not judged: peers are trusted, see the docstring)")
            )
            print(f"control {ph:13s}: " + ", ".join(f"{k} {n}" for k, n in c.items()) + verdict)
            if bad and judged:
                ok = False
    if st.rss:
        base = info.get("rss_after_warmup") or st.rss[0][1]
        peak = max(r for _, r in st.rss)
        growth = (peak - base) / 2**20
        flag = " ← FAIL" if growth > args.rss_growth else ""
        print(
            f"RSS: {base / 2**20:.0f} MB after warm-up, peak {peak / 2**20:.0f} MB (+{growth:.0f} MB, bound {args.rss_growth:.0f} MB){flag}"
        )
        ok = ok and not flag
    if st.died or not info.get("alive_at_end", False):
        print(f"node process DIED: {st.died or 'not alive at the end'} ← FAIL")
        ok = False
    else:
        print("node process: alive throughout")
    tbs = tracebacks(info.get("log", ""))
    print(f"tracebacks in the node's log: {len(tbs)}{' ← FAIL' if tbs else ''}")
    for tb in collections.Counter(tbs).most_common(10):
        print(f"  {tb[1]}× {tb[0]}")
    ok = ok and not tbs
    print(f"slowest accept of a connection: {st.connect_max:.2f} s")
    print(
        f"the fuzzer's own loop: late by {st.lag_max:.2f} s at most; slowest input made in {st.gen_max[0]:.2f} s ({st.gen_max[1][:160]})"
    )
    print(f"connections neither answered nor closed: {len(st.unanswered)}{' ← FAIL' if st.unanswered else ''}")
    for u in st.unanswered[:10]:
        print(f"  {u}")
    ok = ok and not st.unanswered
    print("result: " + ("PASS" if ok else "FAIL"))
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--seconds", type=float, default=240.0, help="length of the fuzzing, warm-up included (default 240)"
    )
    ap.add_argument("--inputs", type=int, default=200_000, help="at most this many inputs (default 200,000)")
    ap.add_argument("--seed", type=int, default=1, help="the mutator's seed (default 1)")
    ap.add_argument("--workers", type=int, default=4, help="concurrent fuzzing connections (default 4)")
    ap.add_argument("--no-auth", dest="auth", action="store_false", help="no [auth]: every client is anonymous")
    ap.add_argument("--no-coverage", dest="coverage", action="store_false", help="run the node without coverage")
    ap.add_argument("--rss-growth", type=float, default=150.0, help="MB the node's RSS may grow (default 150)")
    ap.add_argument("--logs", type=Path, help="keep the node's logs and coverage data in this directory")
    args = ap.parse_args()
    if args.coverage:
        try:
            import coverage  # noqa: F401
        except ImportError:
            print("coverage is not installed (pip install '.[bench]'); running with --no-coverage")
            args.coverage = False
    workdir = Path(tempfile.mkdtemp(prefix="overlay-fuzz-")) if args.logs is None else args.logs
    workdir.mkdir(parents=True, exist_ok=True)
    # uvloop's run and asyncio's differ in their keywords: typed as what both take.
    runner: Callable[[Coroutine[Any, Any, Any]], Any]
    try:
        import uvloop

        runner = uvloop.run
    except ImportError:  # pragma: no cover
        runner = asyncio.run
    st, info, final = runner(run(args, workdir))
    ok = report(st, info, final, args)
    if args.logs is None:
        import shutil

        shutil.rmtree(workdir, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
