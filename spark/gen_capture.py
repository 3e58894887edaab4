"""Generate a large synthetic capture in the schema of ``spark/SCHEMA.md``.

    .venv/bin/python spark/gen_capture.py OUT_DIR [--events 1000000] [--config cluster_configs/hetero5.toml]

A simulated run of the config's cluster, written record by record through
the nodes' own ``overlay.capture.CaptureBuffer`` and encoder, so the files
are what real nodes would write:

* ``--subscriptions`` subscriptions (narrow price ranges, symbol + price, and
  rare large quantities) spread over the nodes as access nodes, subscribed
  in the first second, removed at the end;
* ``--events`` events over ``--seconds``, 70 % of them in the lowest tenth
  of the price range (the demo's skew), published round-robin on the nodes;
  with ``--keys`` (default) each carries the sequence key of its symbol and
  its rank within that key;
* the initializer starts with the whole space; every few slices it splits
  the price range and migrates a part to another node (split and migration
  records with the costs of SPEC §5), so the load spreads out;
* each event is matched with ``overlay.channels.SubscriptionIndex`` over the
  subscriptions of its channel — the tested count is the real matcher's — and
  delivered to each subscriber's access node; slice records carry the
  nodes' exact per-channel loads.

The replay of such a capture passes every validation; it exists to time
``overlay replay`` at scale.
"""

from __future__ import annotations

import argparse
import bisect
import random
import sys
import time
from pathlib import Path
from typing import Any

import msgspec

from overlay.capture import CaptureBuffer, End, capture_file_name, header_for
from overlay.channels import SubscriptionIndex, parse_subscription
from overlay.channels.subscriptions import Subscription
from overlay.config import load_config

SYMBOLS = ("AAPL", "MSFT", "GOOG", "AMZN", "NVDA", "META", "TSLA", "IBM")
FLUSH_EVERY = 50_000


class _NodeFile:
    def __init__(self, path: Path, buf: CaptureBuffer) -> None:
        self.fh = open(path, "wb", buffering=1 << 20)  # noqa: SIM115 — open for the whole run; closed after its End record
        self.buf = buf
        self.enc = msgspec.json.Encoder()
        self.written = 0

    def flush(self) -> None:
        self.written += self.buf.pending
        self.fh.writelines(self.buf.take())  # chunks the buffer encoded, as a node's writer does

    def write(self, rec: Any) -> None:
        self.fh.write(self.enc.encode_lines([rec]))
        self.written += 1


def _subscriptions(rng: random.Random, n: int) -> list[str]:
    out = []
    for _ in range(n):
        kind = rng.random()
        if kind < 0.45:
            lo = rng.uniform(0, 990)
            out.append(f"price >= {lo:.1f} and price < {lo + rng.uniform(2, 20):.1f}")
        elif kind < 0.9:
            lo = rng.uniform(0, 900)
            out.append(
                f'sym = "{rng.choice(SYMBOLS)}" and price >= {lo:.1f} and price < {lo + rng.uniform(10, 100):.1f}'
            )
        else:
            out.append(f"qty > {rng.randint(4900, 4990)}")
    return out


def _price(rng: random.Random) -> float:
    return round(rng.uniform(0, 100) if rng.random() < 0.7 else rng.uniform(0, 1000), 2)


def generate(
    out_dir: Path, config_path: str, events: int, seconds: float, n_subs: int, keys: bool, seed: int
) -> dict[str, Any]:
    cfg = load_config(config_path)
    schema = cfg.schema
    ids = [n.id for n in cfg.nodes]
    cap = {n.id: n.capacity for n in cfg.nodes}
    init = cfg.cluster.initializer
    T = cfg.cluster.slice_seconds
    rng = random.Random(seed)
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = 1_800_000_000.0
    bufs = {i: CaptureBuffer(i) for i in ids}
    files = {i: _NodeFile(out_dir / capture_file_name(i), bufs[i]) for i in ids}
    for i in ids:
        files[i].write(header_for(cfg, i, out_dir.name, t0))

    # Subscriptions: access nodes round-robin, subscribed (and acknowledged) in the first second.
    subs: list[Subscription] = []
    for k, text in enumerate(_subscriptions(rng, n_subs)):
        node = ids[k % len(ids)]
        gid = f"{node}:1:s{k}:{k}"
        b = bufs[node]
        b.now = t0 + 0.1 + k * 0.5 / n_subs
        b.subscribe(gid, f"s{k}", 1, f"gen-{node}", text)
        b.now += 0.01
        b.applied(gid, True)
        subs.append(Subscription(gid, parse_subscription(text, schema), f"gen-{node}", node))

    # Channels: price cuts made over time; each new high part moves away.
    cuts = [0.0, 1000.0]
    owner = {0: init}  # channel index (by low cut) -> node; rebuilt at each split
    chan_ids = {0: f"{init}.0"}
    seq = dict.fromkeys(ids, 0)
    indexes: dict[str, SubscriptionIndex] = {}

    def build(ch: str, lo: float, hi: float) -> int:
        idx = SubscriptionIndex(schema)
        for s in subs:
            ps = s.filter.on("price")
            a = max([p.args[0] for p in ps if p.op.value in (">", ">=")] + [0.0])
            z = min([p.args[0] for p in ps if p.op.value in ("<", "<=")] + [1000.0])
            if a <= hi and z >= lo:
                idx.add(s)
        indexes[ch] = idx
        return len(idx)

    build(chan_ids[0], 0.0, 1000.0)
    all_ids = frozenset(s.id for s in subs)  # every subscriber stays for the whole run
    plan = [25.0, 12.0, 50.0, 6.0, 100.0, 3.0, 200.0, 400.0][: max(0, int(seconds / T / 4))]
    plan_times = [t0 + 1.0 + (k + 1) * (seconds - 2.0) / (len(plan) + 1) for k in range(len(plan))]
    receivers = [n for n in sorted(ids, key=lambda i: -cap[i]) if n != init]

    rate = events / max(seconds - 2.0, 1.0)
    slice_loads: dict[tuple[int, int], dict[str, int]] = {}
    sym_rank: dict[str, int] = {}
    total_deliveries = 0
    t_last = 0.0
    next_plan = 0
    for e in range(events):
        t = t0 + 1.0 + e / rate
        while next_plan < len(plan) and t >= plan_times[next_plan]:
            at = plan[next_plan]
            pos = bisect.bisect_left(cuts, at)
            if cuts[pos] != at:
                parent_lo = cuts[pos - 1]
                parent = chan_ids[pos - 1]
                sender = owner[pos - 1]
                s_slice = int((plan_times[next_plan] - t0) // T)
                lo_id, hi_id = f"{sender}.{seq[sender] + 1}", f"{sender}.{seq[sender] + 2}"
                seq[sender] += 2
                cuts.insert(pos, at)
                chan_ids = {
                    **{k: v for k, v in chan_ids.items() if k < pos - 1},
                    pos - 1: lo_id,
                    pos: hi_id,
                    **{k + 1: v for k, v in chan_ids.items() if k > pos - 1},
                }
                owner = {
                    **{k: v for k, v in owner.items() if k < pos - 1},
                    pos - 1: sender,
                    pos: sender,
                    **{k + 1: v for k, v in owner.items() if k > pos - 1},
                }
                n_lo = build(lo_id, parent_lo, at)
                n_hi = build(hi_id, at, cuts[pos + 1])
                b = bufs[sender]
                b.now = plan_times[next_plan]
                b.journal(
                    {
                        "kind": "split",
                        "node": sender,
                        "time": b.now,
                        "slice": s_slice,
                        "parent": parent,
                        "attr": "price",
                        "children": [
                            {"id": lo_id, "space": f"price ∈ [{parent_lo}, {at}]", "subscriptions": n_lo},
                            {"id": hi_id, "space": f"price ∈ ({at}, {cuts[pos + 1]}]", "subscriptions": n_hi},
                        ],
                    }
                )
                receiver = receivers[next_plan % len(receivers)]
                bw = cfg.bw(sender, receiver)
                dur = 0.05 + n_hi / bw / 100
                b.now += dur
                b.journal(
                    {
                        "kind": "migration",
                        "node": sender,
                        "time": b.now,
                        "slice": s_slice,
                        "session": next_plan + 1,
                        "receiver": receiver,
                        "channels": [hi_id],
                        "subscriptions": n_hi,
                        "bytes": 90 * n_hi,
                        "bw": bw,
                        "mig_cost": n_hi / bw,
                        "forced": False,
                        "duration": dur,
                    }
                )
                owner[pos] = receiver
            next_plan += 1
        price = _price(rng)
        sym = rng.choice(SYMBOLS)
        values = {"price": price, "sym": sym, "qty": rng.randint(1, 5000)}
        access = ids[e % len(ids)]
        eid = f"{access}-{e // len(ids) + 1}"
        ci = min(bisect.bisect_right(cuts, price) - 1, len(cuts) - 2)
        if ci > 0 and price == cuts[ci]:
            ci -= 1  # cuts are (lo, hi]: a value on a cut belongs to the lower channel
        ch, node = chan_ids[ci], owner[ci]
        key = rank = None
        if keys:
            rank = sym_rank[sym] = sym_rank.get(sym, 0) + 1
            key = sym
        ba = bufs[access]
        ba.now = t
        ba.publish(eid, ch, values, key, rank)
        matched, tested = indexes[ch].match(values)
        bo = bufs[node]
        bo.now = t + 0.0002
        sl = int((bo.now - t0) // T)
        bo.event(eid, access, ch, tested, matched, sl, key, rank)
        loads = slice_loads.setdefault((node, sl), {})
        loads[ch] = loads.get(ch, 0) + tested
        by_node: dict[int, list[str]] = {}
        for s in matched:
            by_node.setdefault(s.access_node, []).append(s.id)
        for n, gids in by_node.items():
            bn = bufs[n]
            bn.now = t + 0.0004
            bn.deliver(eid, gids, all_ids)
            total_deliveries += len(gids)
        t_last = t
        if e % FLUSH_EVERY == 0:
            for f in files.values():
                f.flush()
    # Slice records: every node, every slice up to the last event's.
    last_slice = int((t_last + 0.001 - t0) // T)
    for k in range(last_slice + 1):
        d = {i: float(sum(slice_loads.get((i, k), {}).values())) for i in ids}
        dc = {i: d[i] / cap[i] for i in ids}
        mean = sum(dc.values()) / len(ids)
        spread = (sum((v - mean) ** 2 for v in dc.values()) / len(ids)) ** 0.5
        for i in ids:
            state = "OVERLOADED" if dc[i] > 1.1 * mean else "UNDERLOADED" if dc[i] < 0.9 * mean else "STABLE"
            b = bufs[i]
            b.journal(
                {
                    "kind": "slice",
                    "node": i,
                    "time": t0 + (k + 1) * T,
                    "slice": k + 1,
                    "d": d[i],
                    "dc": dc[i],
                    "mean": mean,
                    "spread": spread,
                    "state": state,
                    "channels": {c: float(v) for c, v in slice_loads.get((i, k), {}).items()},
                    "slice_seconds": T,
                }
            )
    t_end = t0 + (last_slice + 1) * T + 1.0
    for s in subs:
        b = bufs[s.access_node]
        b.now = t_end - 0.5
        b.unsubscribe(s.id, "closed")
        b.now += 0.01
        b.applied(s.id, False)
    for i in ids:
        files[i].flush()
        b = bufs[i]
        b.n += 1
        files[i].write(End(i, b.n, t_end, files[i].written + 1, 0))
        files[i].fh.close()
    return {
        "events": events,
        "deliveries": total_deliveries,
        "subscriptions": n_subs,
        "migrations": next_plan,
        "bytes": sum((out_dir / capture_file_name(i)).stat().st_size for i in ids),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out_dir")
    p.add_argument("--config", default=str(Path(__file__).resolve().parent.parent / "cluster_configs" / "hetero5.toml"))
    p.add_argument("--events", type=int, default=1_000_000)
    p.add_argument("--seconds", type=float, default=300.0)
    p.add_argument("--subscriptions", type=int, default=400)
    p.add_argument("--no-keys", action="store_true", help="events without sequence keys")
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args(argv)
    t = time.monotonic()
    res = generate(Path(a.out_dir), a.config, a.events, a.seconds, a.subscriptions, not a.no_keys, a.seed)
    print(
        f"{res['events']} events, {res['deliveries']} deliveries, {res['subscriptions']} subscriptions, "
        f"{res['migrations']} migrations, {res['bytes'] / 1e6:.0f} MB in {a.out_dir} "
        f"({time.monotonic() - t:.0f}s)",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
