"""Subscriptions and events as the content model stores them."""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from overlay.channels.predicates import Filter
from overlay.channels.schema import Schema, Value

__all__ = ["Event", "Subscription"]


class Subscription(msgspec.Struct, frozen=True, gc=False):
    """A filter held on behalf of one subscriber.

    Invariant: ``id`` is unique in the cluster (the access node makes it from
    its node id and a counter), so a channel stores a subscription once however
    many times it is re-sent.

    ``gc=False``: strings, numbers and a ``Filter`` (itself ``gc=False``) lead
    back to nothing, so no cycle runs through a subscription, and a node's
    hundreds of thousands of them cost the cyclic GC nothing
    (``overlay.channels.predicates`` rule 8).
    """

    id: str
    filter: Filter
    subscriber: str = ""
    access_node: int = 0
    # Subscriber groups (SPEC §11): "" = not in a group; weight is the static Ws.
    group: str = ""
    weight: float = 1.0


class Event(msgspec.Struct, frozen=True):
    """``e = a1 ∧ … ∧ ak``: one value per attribute, already checked against the schema."""

    values: dict[str, Value]

    @classmethod
    def checked(cls, values: Mapping[str, object], schema: Schema) -> Event:
        return cls(schema.check_event_values(values))
