"""``overlay.testing.Ledger.violations`` (rule 1 of ``overlay.testing._ledger``):
the same verdict as a check of every (event, subscription) pair, from far
fewer filter tests.

``every_pair`` below is that check, as ``violations`` was written before it
looked only at the pairs that can matter: the reference each ledger here is
judged against — a balancing run's shape (the ledger ``test_balancing``
fills), and Hypothesis's small ledgers with every kind of breach, events
lacking attributes, NaN, booleans and integers past 2**53.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Callable
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from conftest import LOCAL
from overlay.channels import parse_subscription
from overlay.channels.predicates import Filter, Op, Predicate, compile_filter
from overlay.testing import Ledger, Sub, _ledger, skewed_price
from overlay.testing._ledger import NEVER


def every_pair(led: Ledger) -> tuple[list[str], int, int]:
    """The reference: each subscription against each event, in ``qty`` order."""
    bad: list[str] = []
    exact = 0
    undelivered_in_window = 0
    events = sorted(led.events.items())
    seen_pairs = set()
    for (ci, sid), s in led.subs.items():
        for qty, (values, start, ack) in events:
            n = led.delivered.get((ci, sid, qty), 0)
            if n:
                seen_pairs.add((ci, sid, qty))
            if not s.filter.matches(values):
                if n:
                    bad.append(f"event {qty} {values} delivered {n}x to {ci}/{sid} ({s.expression}) it does not match")
                continue
            if led.expected(s, qty, start):
                exact += 1
                if n != 1:
                    bad.append(f"event {qty} {values} delivered {n}x to {ci}/{sid} ({s.expression}), expected once")
            elif n > 1:
                bad.append(f"event {qty} delivered {n}x to {ci}/{sid} (in-flight window)")
            elif n and start > s.unsub_acked:
                bad.append(f"event {qty} published after the UnsubAck of {ci}/{sid} was delivered to it")
            elif not n and s.acked < start and ack < s.unsub_started:
                undelivered_in_window += 1
    stray = set(led.delivered) - seen_pairs
    bad += [f"delivery {k} names no known subscription or event" for k in sorted(stray)[:5]]
    return bad, exact, undelivered_in_window


def _expression(rng: random.Random) -> str:
    """test_balancing's subscriptions, and a few shapes more (ranges, ``=``, no bound on a number)."""
    lo = rng.uniform(0, 950)
    hi = min(1000.0, lo + rng.uniform(10, 250))
    sym = rng.choice("ABCD")
    match rng.randrange(8):
        case 0:
            return f"price >= {lo:.1f} and price < {hi:.1f}"
        case 1:
            return f'price >= {lo:.1f} and price <= {hi:.1f} and sym = "{sym}"'
        case 2:
            return f'sym = "{sym}" and qty < {rng.randrange(1, 2_000)}'
        case 3:
            return f"price > {lo:.1f} and price < {hi:.1f} and qty >= {rng.randrange(2_000)}"
        case 4:
            return f'sym in {{"{sym}", "{rng.choice("ABCD")}"}} and price < {hi:.1f}'
        case 5:
            return f"price in [{lo:.1f}, {hi:.1f}]"
        case 6:
            return f"qty = {rng.randrange(2_000)}"
        case _:
            return f'sym = "{sym}"'


def balancing_ledger(seed: int, events: int = 1_500, subs: int = 80) -> Ledger:
    """A run's ledger: each subscription acknowledged, some unsubscribed; every
    pair due delivered once, then breaches of each kind planted."""
    rng = random.Random(seed)
    led = Ledger()
    for k in range(events):
        start = 1_000.0 + k / 250
        values = {"price": skewed_price(k), "sym": "ABCD"[k * 7 % 4] if k % 3 else "A", "qty": k}
        led.events[k] = (values, start, start + rng.uniform(0.001, 0.05))
    for j in range(subs):
        ci = j % 6
        led.access[ci] = ci % 3
        expr = _expression(rng)
        started = 1_000.0 + rng.uniform(-1, events / 250)
        s = Sub(ci, f"s{j}", expr, parse_subscription(expr, LOCAL.schema), started, started + 0.01)
        if rng.random() < 0.3:
            s.unsub_started = s.acked + rng.uniform(0, events / 500)
            s.unsub_acked = s.unsub_started + 0.01
        led.subs[(ci, s.sub_id)] = s
    for (ci, sid), s in led.subs.items():
        for qty, (values, start, _ack) in led.events.items():
            if s.filter.matches(values) and s.acked < start and start < s.unsub_started:
                led.delivered[(ci, sid, qty)] += 1
                led.first_seen.setdefault((led.access[ci], qty), start + 0.02)
    keys = sorted(led.delivered)
    for key in rng.sample(keys, 5):
        led.delivered[key] += 1  # twice
    for key in rng.sample(keys, 5):
        del led.delivered[key]  # lost
    ci, sid = next(iter(led.subs))
    led.delivered[(ci, sid, rng.randrange(events))] += 1  # perhaps where it does not match
    led.delivered[(ci, "nobody", 3)] += 1
    led.delivered[(ci, sid, events + 7)] += 1
    return led


def test_a_balancing_runs_ledger_gets_the_verdict_of_every_pair() -> None:
    for seed in range(2):
        led = balancing_ledger(seed)
        got = led.violations()
        assert got == every_pair(led)
        assert got[0] and got[1] > 1_000  # breaches found, and many pairs due


def test_the_filters_are_tested_on_a_fraction_of_the_pairs(monkeypatch: Any) -> None:
    """Work, not time: a filter is asked about the events in its slice and its deliveries."""
    led = balancing_ledger(7)
    calls = 0

    def counting(f: Filter) -> Callable[[dict[str, Any]], bool]:
        test = compile_filter(f)

        def call(values: dict[str, Any]) -> bool:
            nonlocal calls
            calls += 1
            return test(values)

        return call

    monkeypatch.setattr(_ledger, "compile_filter", counting)
    assert led.violations() == every_pair(led)
    pairs = len(led.events) * len(led.subs)
    assert calls < pairs / 2, f"{calls} filter tests for {pairs} pairs"


async def test_judged_off_the_loop_the_loop_runs_on_meanwhile() -> None:
    """Rule 2: the loop's other tasks run while the pairs are judged (the
    nodes of a LoopbackCluster share it), and the verdict is the same."""
    led = balancing_ledger(3)
    turns = 0

    async def turn() -> None:
        nonlocal turns
        while True:
            turns += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(turn())
    try:
        got = await led.violations_off_loop()
    finally:
        task.cancel()
    assert got == every_pair(led)
    assert turns > 1, "the loop ran nothing while the pairs were judged"


def test_a_snapshot_is_judged_as_it_was_taken() -> None:
    """Rule 2: a delivery after the snapshot (a late Notify reaching a hook) is not in it."""
    led = balancing_ledger(4)
    snap = led.snapshot()
    want = every_pair(led)
    key = next(iter(led.delivered))
    led.delivered[key] += 1
    next(iter(led.subs.values())).unsub_acked = 0.0
    assert snap.violations() == want


# -- Hypothesis: small ledgers of every shape ----------------------------------------------

NUMBERS = st.one_of(
    st.integers(-5, 5),
    st.floats(-5, 5, allow_nan=False),
    st.integers(2**53, 2**53 + 4),  # past a float's exact integers
    st.just(math.nan),
    st.booleans(),
)
# x holds numbers, y strings: a comparison across the two raises, in both checks alike.
VALUES = {"x": NUMBERS, "y": st.sampled_from(["a", "b", "c"])}
ATTRS = tuple(VALUES)
OPS = (Op.LT, Op.LE, Op.GT, Op.GE, Op.EQ, Op.NE, Op.IN_RANGE, Op.NOT_IN_RANGE, Op.EXISTS, Op.NOT_EXISTS)


@st.composite
def predicates(draw: st.DrawFn) -> Predicate:
    attr = draw(st.sampled_from(ATTRS))
    op = draw(st.sampled_from(OPS))
    if op is Op.EXISTS or op is Op.NOT_EXISTS:
        return Predicate(attr, op, ())
    if op is Op.IN_RANGE or op is Op.NOT_IN_RANGE:
        lo, hi = sorted(draw(st.lists(VALUES[attr].filter(lambda v: v == v), min_size=2, max_size=2)))
        return Predicate(attr, op, (lo, hi))
    return Predicate(attr, op, (draw(VALUES[attr]),))


@st.composite
def ledgers(draw: st.DrawFn) -> Ledger:
    led = Ledger()
    times = st.sampled_from([0.0, 1.0, 2.0, 3.0, NEVER])
    for qty in range(draw(st.integers(0, 8))):
        values = {a: draw(VALUES[a]) for a in ATTRS if draw(st.booleans()) or qty % 3}
        led.events[qty] = (values, draw(times), draw(times))
    for j in range(draw(st.integers(0, 4))):
        led.access[j] = j % 2
        f = Filter(tuple(draw(st.lists(predicates(), min_size=1, max_size=3))))
        s = Sub(j, f"s{j}", "drawn", f, draw(times), draw(times), draw(times), draw(times))
        led.subs[(j, s.sub_id)] = s
    for _ in range(draw(st.integers(0, 12))):
        key = (draw(st.integers(0, 4)), f"s{draw(st.integers(0, 4))}", draw(st.integers(0, 9)))
        led.delivered[key] += draw(st.integers(0, 2))
        led.first_seen.setdefault((key[0] % 2, key[2]), draw(times))
    return led


@given(ledgers())
def test_any_ledger_gets_the_verdict_of_every_pair(led: Ledger) -> None:
    assert led.violations() == every_pair(led)
