"""The matcher bench's workloads (``bench/matching.py`` rules 1, 5 and 6):
random subscriptions and events, reproducible from a seed.

Rules this module keeps:

1. The *selective* workload (``Workload.subscriptions``, ``events``): over
   ``SCHEMA``, 1 to ``MAX_PREDICATES`` predicates on distinct attributes, a
   float range covering ``RANGE_FRACTION`` of its domain or an ``=`` on the
   int or on a string of a vocabulary of ``SYM_VOCABULARY`` words; events
   uniform over every attribute's domain, all present.
2. The *mixed* workload (``mixed_subscriptions``, ``mixed_events``): every
   operator of the extended language — each subscription 1 or 2 conjuncts,
   each conjunct an anchor plus up to two broad predicates, and only
   satisfiable ones kept; events without ``qty`` or ``venue`` now and then
   (``ABSENT_SHARE``).
3. The *research* workload (``ResearchWorkload``) of the REIN, TAMA and
   OpIndex papers: ``RESEARCH_ATTRS`` integer attributes over
   ``[0, RESEARCH_DOMAIN)``, each subscription ``RESEARCH_PREDICATES`` of
   them each ranging over half the domain, events uniform on all.
4. Every subscription and event is checked against its schema, as a node
   checks what it is sent.
"""

from __future__ import annotations

import random
import string
from typing import Final

from overlay.channels import Attribute, Filter, Kind, Op, Predicate, Schema, Subscription, Value

# Distinct values of the string attribute (the brief asks for ~100-1000).
SYM_VOCABULARY: Final = 500
# A float range covers this fraction of its domain, drawn uniformly.
RANGE_FRACTION: Final = (0.01, 0.05)
MAX_PREDICATES: Final = 4

SCHEMA: Final = Schema(
    [
        Attribute("price", Kind.FLOAT, 0.0, 1000.0),
        Attribute("temp", Kind.FLOAT, -40.0, 60.0),
        Attribute("qty", Kind.INT, 0, 999),
        Attribute("sym", Kind.STRING, 1, 8),
        # Only the mixed workload's events carry it (the selective ones never do).
        Attribute("venue", Kind.STRING, 0, 8),
    ],
    ["price", "sym"],
)
# The research workload (rule 3): 20 integer attributes, 10 ranges of half
# the domain per subscription, uniform events.
RESEARCH_ATTRS: Final = 20
RESEARCH_PREDICATES: Final = 10
RESEARCH_DOMAIN: Final = 1_000_000
RESEARCH_SCHEMA: Final = Schema(
    [Attribute(f"a{i}", Kind.INT, 0, RESEARCH_DOMAIN - 1) for i in range(RESEARCH_ATTRS)],
    ["a0"],
)
# Mixed workload: the share of events without each non-distinguishing attribute.
ABSENT_SHARE: Final = {"qty": 0.2, "venue": 0.3}
VENUES: Final = ("XNYS", "XNAS", "BATS", "ARCX", "IEXG", "EDGX", "XCHI", "MEMX")


class Workload:
    """Random subscriptions and events over ``SCHEMA``, reproducible from a seed."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        words: set[str] = set()
        while len(words) < SYM_VOCABULARY:
            n = self.rng.randint(2, 6)
            words.add("".join(self.rng.choices(string.ascii_uppercase, k=n)))
        self.vocabulary = sorted(words)
        self.attrs = [a for a in SCHEMA.attributes.values() if a.name != "venue"]

    def predicate(self, attr: Attribute) -> Predicate:
        rng = self.rng
        if attr.kind is Kind.FLOAT:
            span = attr.max - attr.min
            width = span * rng.uniform(*RANGE_FRACTION)
            lo = rng.uniform(attr.min, attr.max - width)
            return Predicate(attr.name, Op.IN_RANGE, (lo, lo + width))
        if attr.kind is Kind.INT:
            return Predicate(attr.name, Op.EQ, (rng.randint(int(attr.min), int(attr.max)),))
        return Predicate(attr.name, Op.EQ, (rng.choice(self.vocabulary),))

    def subscriptions(self, n: int) -> list[Subscription]:
        subs = []
        for i in range(n):
            k = self.rng.randint(1, MAX_PREDICATES)
            attrs = self.rng.sample(self.attrs, k)
            f = Filter(tuple(self.predicate(a) for a in attrs)).check(SCHEMA)
            subs.append(Subscription(f"s{i}", f))
        return subs

    def value(self, attr: Attribute) -> Value:
        if attr.kind is Kind.FLOAT:
            return self.rng.uniform(attr.min, attr.max)
        if attr.kind is Kind.INT:
            return self.rng.randint(int(attr.min), int(attr.max))
        return self.rng.choice(self.vocabulary)

    def events(self, n: int) -> list[dict[str, Value]]:
        """Uniform over every attribute's domain, all attributes present, checked."""
        return [SCHEMA.check_event_values({a.name: self.value(a) for a in self.attrs}) for _ in range(n)]

    # -- the mixed workload (rule 2) -------------------------------------------------

    def anchor(self) -> Predicate:
        rng = self.rng
        word = rng.choice(self.vocabulary)
        kind = rng.choice(("range", "eq", "ieq", "iprefix", "isuffix", "like", "like suffix"))
        if kind == "range":
            return self.predicate(SCHEMA.attributes[rng.choice(("price", "temp"))])
        if kind == "eq":
            return self.predicate(SCHEMA.attributes[rng.choice(("qty", "sym"))])
        if kind == "ieq":
            return Predicate("sym", Op.IEQ, (word.lower(),))
        if kind == "iprefix":
            return Predicate("sym", Op.IPREFIX, (word[:3].lower(),))
        if kind == "isuffix":
            return Predicate("sym", Op.ISUFFIX, (word[-3:].lower(),))
        if kind == "like suffix":
            return Predicate("sym", Op.LIKE, (f"*{word[-3:]}",))
        return Predicate("sym", Op.LIKE, (f"{word[0]}*{word[-2:]}",))

    def broad(self) -> Predicate:
        rng = self.rng
        kind = rng.choice(("not in set", "not in range", "exists", "not exists"))
        if kind == "not in set":
            return Predicate("sym", Op.NOT_IN_SET, tuple(rng.sample(self.vocabulary, 3)))
        if kind == "not in range":
            name = rng.choice(("price", "qty"))
            attr = SCHEMA.attributes[name]
            lo = rng.uniform(attr.min, attr.max) if name == "price" else rng.randint(0, 900)
            hi = lo + (attr.max - attr.min) * 0.1
            return Predicate(name, Op.NOT_IN_RANGE, (lo, min(hi, attr.max)) if name == "price" else (lo, int(hi)))
        if kind == "exists":
            return Predicate(rng.choice(("venue", "qty")), Op.EXISTS, ())
        return Predicate("venue", Op.NOT_EXISTS, ())

    def mixed_subscriptions(self, n: int) -> list[Subscription]:
        """``n`` subscriptions of 1 or 2 conjuncts, each conjunct indexed as its
        own subscription ``s<i>|<j>`` (as a channel holds them)."""
        subs: list[Subscription] = []
        i = 0
        while len(subs) < n:
            for j in range(self.rng.randint(1, 2)):
                preds = [self.anchor()] + [self.broad() for _ in range(self.rng.randint(0, 2))]
                f = Filter(tuple(preds)).check(SCHEMA)
                if f.satisfiable(SCHEMA):
                    subs.append(Subscription(f"s{i}|{j}", f))
            i += 1
        return subs[:n]

    def mixed_events(self, n: int) -> list[dict[str, Value]]:
        out = []
        for _ in range(n):
            values = {a.name: self.value(a) for a in self.attrs}
            values["venue"] = self.rng.choice(VENUES)
            for name, share in ABSENT_SHARE.items():
                if self.rng.random() < share:
                    del values[name]
            out.append(SCHEMA.check_event_values(values))
        return out


class ResearchWorkload:
    """Rule 3's subscriptions and events, reproducible from a seed."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.names = list(RESEARCH_SCHEMA.attributes)

    def subscriptions(self, n: int, prefix: str = "r") -> list[Subscription]:
        rng = self.rng
        half = RESEARCH_DOMAIN // 2
        subs = []
        for i in range(n):
            preds = []
            for name in rng.sample(self.names, RESEARCH_PREDICATES):
                lo = rng.randrange(RESEARCH_DOMAIN - half + 1)
                preds.append(Predicate(name, Op.IN_RANGE, (lo, lo + half - 1)))
            subs.append(Subscription(f"{prefix}{i}", Filter(tuple(preds)).check(RESEARCH_SCHEMA)))
        return subs

    def events(self, n: int) -> list[dict[str, Value]]:
        rng = self.rng
        return [
            RESEARCH_SCHEMA.check_event_values({name: rng.randrange(RESEARCH_DOMAIN) for name in self.names})
            for _ in range(n)
        ]
