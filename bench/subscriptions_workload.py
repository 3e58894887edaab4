"""The subscriptions bench's workload (``bench/subscriptions.py`` rules 2
and 3): its schema, the subscriptions its loaders send, and the events and
probes of its live measure.

Rules this module keeps:

1. The event space is cut on ``price`` into ``NODES`` bands of ``BAND``;
   ``subscription(rng, band)`` lies inside its band alone, so the node
   owning a band holds exactly the subscriptions of that band.
2. A subscription has 2 to ``MAX_PREDICATES`` predicates (uniform), one per
   attribute: a ``price`` range inside its band, a ``sym`` equality or
   small set over ``SYMBOLS`` symbols, and the rest over ``NUMERIC``
   (ranges, bounds, equality) and ``STRINGS`` (equality, prefix, sets,
   inequality) — selective enough that an event notifies a handful.
3. ``id`` is the probes' attribute alone: a probe subscription
   (``probe_subscription``) names its event's ``id`` (at least
   ``PROBE_ID``), so that event matches the probe and no other probe; no
   loaded subscription constrains ``id``.
4. Everything is drawn from the ``random.Random`` it is given: a seed
   makes the same workload again.
"""

from __future__ import annotations

import json
import math
import random
from typing import Any, Final

NODES: Final = 5
BAND: Final = 200.0  # price band of one channel: [0, 1000] cut in five
SYMBOLS: Final = 10_000  # sym values: an equality on sym keeps an event's matches to a handful
NUMERIC: Final = tuple(f"x{i:02d}" for i in range(1, 15))
STRINGS: Final = ("t1", "t2", "t3", "t4")
WORDS: Final = tuple(
    a + b for a in ("al", "be", "ga", "de", "ep", "ze", "et", "th") for b in ("pha", "ta", "mma", "lta", "sil", "ro")
)
MAX_PREDICATES: Final = 20
PROBE_ID: Final = 500_000_000  # probe events' ids from here up; background events' below
SCHEMA: Final = (
    """[schema]
# Twenty attributes a subscription may constrain (price, sym and eighteen
# more), and id, which only the probes use: a probe's event matches the
# probe and none of the loaded subscriptions.
distinguishing = ["price", "sym"]
attributes = [
  { name = "price", type = "float", min = 0, max = 1000 },
  { name = "sym", type = "string", min = 1, max = 8 },
  { name = "id", type = "int", min = 0, max = 1000000000 },
"""
    + "".join(f'  {{ name = "{x}", type = "float", min = 0, max = 1000 }},\n' for x in NUMERIC)
    + "".join(f'  {{ name = "{t}", type = "string", min = 0, max = 16 }},\n' for t in STRINGS)
    + "]\n"
)


def _num(rng: random.Random) -> float:
    return round(rng.uniform(0.0, 1000.0), 2)


def _sym(rng: random.Random) -> str:
    return f"S{rng.randrange(SYMBOLS):04d}"


def _numeric_predicate(rng: random.Random, attr: str) -> str:
    kind = rng.randrange(4)
    if kind == 0:
        lo = _num(rng)
        return f"{attr} in [{lo}, {min(1000.0, round(lo + rng.uniform(50, 600), 2))}]"
    if kind == 1:
        return f"{attr} >= {_num(rng)}"
    if kind == 2:  # never below 1: "x < 0" can never match, and the node refuses it
        return f"{attr} < {max(1.0, _num(rng))}"
    return f"{attr} = {float(rng.randrange(1000))}"


def _string_predicate(rng: random.Random, attr: str) -> str:
    kind = rng.randrange(4)
    if kind == 0:
        return f'{attr} = "{rng.choice(WORDS)}"'
    if kind == 1:
        return f'{attr} prefix "{rng.choice(WORDS)[:2]}"'
    if kind == 2:
        return f"{attr} in {{{', '.join(json.dumps(w) for w in rng.sample(WORDS, 3))}}}"
    return f'{attr} != "{rng.choice(WORDS)}"'


def price_range(rng: random.Random, band: int) -> tuple[float, float]:
    lo = round(band * BAND + 1.0 + rng.uniform(0.0, BAND - 102.0), 2)
    return lo, round(lo + rng.uniform(5.0, 100.0), 2)


def subscription(rng: random.Random, band: int) -> str:
    """A loaded subscription of ``band`` (rule 3): 2 to 20 predicates."""
    lo, hi = price_range(rng, band)
    preds = [f"price in [{lo}, {hi}]"]
    if rng.random() < 0.8:
        preds.append(f'sym = "{_sym(rng)}"')
    else:
        preds.append(f"sym in {{{', '.join(json.dumps(_sym(rng)) for _ in range(3))}}}")
    for attr in rng.sample(NUMERIC + STRINGS, rng.randint(2, MAX_PREDICATES) - 2):
        preds.append(_numeric_predicate(rng, attr) if attr in NUMERIC else _string_predicate(rng, attr))
    return " and ".join(preds)


def event(rng: random.Random, ident: int, band: int | None = None) -> dict[str, Any]:
    """An event carrying every attribute; ``band`` picks its price band."""
    b = rng.randrange(NODES) if band is None else band
    ev: dict[str, Any] = {"price": round(b * BAND + rng.uniform(1.0, BAND - 1.0), 2), "sym": _sym(rng), "id": ident}
    ev.update({x: _num(rng) for x in NUMERIC})
    ev.update({t: rng.choice(WORDS) for t in STRINGS})
    return ev


def probe_subscription(rng: random.Random, ev: dict[str, Any]) -> str:
    """A subscription ``ev`` matches, of 3 to 20 predicates, one of them
    ``id = ev["id"]`` (so no other probe's event matches it)."""
    p = ev["price"]
    preds = [f"price in [{max(0.0, round(p - 5, 2))}, {min(1000.0, round(p + 5, 2))}]", f"id = {ev['id']}"]
    preds.append(f'sym = "{ev["sym"]}"')
    for attr in rng.sample(NUMERIC + STRINGS, rng.randint(0, MAX_PREDICATES - 3)):
        v = ev[attr]
        if attr in NUMERIC:
            preds.append(
                rng.choice([f"{attr} >= {math.floor(v)}", f"{attr} < {math.floor(v) + 1}", f"{attr} in [{v}, {v}]"])
            )
        else:
            preds.append(rng.choice([f'{attr} = "{v}"', f'{attr} prefix "{v[:2]}"', f'{attr} != "{v}x"']))
    return " and ".join(preds)
