"""The simulated clients' workload: subscriptions (``SubSpec``) with a matcher
of their own, independent of the node's, and their random draw (``sim.clients``).
The steady skewed traffic of ``sim.convergence`` is ``overlay.testing``'s
(``skewed_price``, ``range_subscriptions``), which the real-node balancing
tests publish too."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from overlay.testing._traffic import PRICE_MAX

__all__ = ["PRICE_MAX", "QTY_MAX", "SYMS", "SubSpec", "clamp_price", "literal", "payload_of", "random_spec"]

SYMS: Final = ("A", "AB", "ABC", "B", "BA", "C", "X", "XY")
QTY_MAX: Final = 1000
# Deterministic: maps encode sorted, whatever PYTHONHASHSEED is.
_PAYLOAD_ENCODER: Final = msgspec.msgpack.Encoder(order="deterministic")


def payload_of(values: dict[str, Any]) -> bytes:
    """The payload every simulated event carries: binary bytes made of its
    values, so each Notify's payload is checked against its event's
    (``sim.clients``): a payload arrives unchanged on every path the
    simulator drives, migrations and node deaths included."""
    return b"\x00\xfe" + _PAYLOAD_ENCODER.encode(values)


@dataclass(frozen=True)
class SubSpec:
    """A subscription as the simulator generated it: ``(attr, op, arg)`` terms.

    ``matches`` is the simulator's own evaluation, independent of the
    overlay's predicates, matcher and index."""

    terms: tuple[tuple[str, str, Any], ...]

    def text(self) -> str:
        parts = []
        for attr, op, arg in self.terms:
            if op == "in[]":
                parts.append(f"{attr} in [{literal(arg[0])}, {literal(arg[1])}]")
            elif op == "in{}":
                parts.append(f"{attr} in {{{', '.join(literal(v) for v in sorted(arg))}}}")
            elif op == "prefix":
                parts.append(f"{attr} prefix {literal(arg)}")
            else:
                parts.append(f"{attr} {op} {literal(arg)}")
        return " and ".join(parts)

    def matches(self, values: dict[str, Any]) -> bool:
        for attr, op, arg in self.terms:
            v = values[attr]
            if op == ">=":
                ok = v >= arg
            elif op == ">":
                ok = v > arg
            elif op == "<=":
                ok = v <= arg
            elif op == "<":
                ok = v < arg
            elif op == "=":
                ok = v == arg
            elif op == "!=":
                ok = v != arg
            elif op == "in[]":
                ok = arg[0] <= v <= arg[1]
            elif op == "in{}":
                ok = v in arg
            elif op == "prefix":
                ok = v.startswith(arg)
            else:  # pragma: no cover
                raise AssertionError(op)
            if not ok:
                return False
        return True


def literal(v: Any) -> str:
    if isinstance(v, str):
        return '"' + v + '"'
    if isinstance(v, float):
        return f"{v:.1f}"
    return str(v)


def clamp_price(x: float) -> float:
    return float(min(max(round(x, 1), 0.0), PRICE_MAX))


def random_spec(rng: random.Random) -> SubSpec:
    terms: list[tuple[str, str, Any]] = []
    r = rng.random()
    lo = clamp_price(rng.uniform(0, PRICE_MAX))
    hi = clamp_price(lo + rng.uniform(1, 300))
    # The node refuses a filter no event can match (``bad_expression``): at
    # the edges of price's range a bound is made inclusive (no draw changes).
    if r < 0.5:
        if hi > lo:
            terms += [("price", ">=", lo), ("price", "<", max(hi, lo + 0.1))]
        else:
            terms += [("price", ">=", lo), ("price", "<" if lo < PRICE_MAX else "<=", PRICE_MAX)]
    elif r < 0.65:
        terms.append(("price", "in[]", (lo, hi)))
    elif r < 0.75:
        op = rng.choice(("<=", ">", "<", ">="))
        if (op == "<" and lo <= 0.0) or (op == ">" and lo >= PRICE_MAX):
            op += "="
        terms.append(("price", op, lo))
    elif r < 0.8:
        terms.append(("price", "=", clamp_price(rng.uniform(0, PRICE_MAX))))
    s = rng.random()
    if s < 0.25:
        terms.append(("sym", "=", rng.choice(SYMS)))
    elif s < 0.4:
        terms.append(("sym", "in{}", frozenset(rng.sample(SYMS, rng.randint(1, 3)))))
    elif s < 0.5:
        terms.append(("sym", "prefix", rng.choice(("A", "B", "X"))))
    elif s < 0.55:
        terms.append(("sym", "!=", rng.choice(SYMS)))
    if rng.random() < 0.2:
        terms.append(("qty", "<=", rng.randint(0, QTY_MAX)))
    if not terms:
        terms.append(("price", ">=", 0.0))
    return SubSpec(tuple(terms))


# -- steady skewed traffic (sim.convergence, and the real-node balcluster) ------------
