"""What a peer message must hold before a component acts on it (SPEC §16, "absurd input").

The codec checks types and the bounds the message types declare; what only
the schema can judge — a filter's predicates, an event's values, a
channel's space — is checked here, once, before the message reaches a
component (``PeerMessages.handle``).  Found by ``bench/fuzz.py``: a filter
whose bound is a string, a predicate without its value, a space with a
constraint on an attribute that is not distinguishing — each raised deep in
a component (a ``TypeError``, an ``IndexError``), and a space of an
``UpdateRoutingTable`` stayed in the routing table, which then failed every
later lookup.

Rules:

1. A message either passes whole or is refused whole with
   ``RemoteProtocolError`` naming the message and what is wrong; nothing
   of it has been applied then.
2. Filters: at least one predicate, each valid for the schema
   (``Predicate.check``: a known attribute, an operator of its kind, values
   of its type and domain).  A filter no event can match is *not* refused:
   tables and channels handle one.
3. Events (an Event, or one a Reforward or DeliveryHandover carries):
   ``Schema.check_event_values`` (known attributes, values of their kind,
   finite and in range, every distinguishing attribute), and a finite
   publish time.  Not a
   Notification's: its owner checked the Event, and its values only go on
   to clients, on the hot path of every delivery.
4. Spaces: one constraint per distinguishing attribute in the schema's
   order, each of its attribute's kind, an interval's ends finite numbers
   inside the domain with ``lo <= hi``; a route names at least one owner;
   a transferred channel's past owners left at finite times.
5. Subscriptions that travel whole (SubscriptionMove, Rebuild): their
   filter, and a weight in ``(0, MAX_WEIGHT]``; group states' weights and
   load factors in their ranges.
6. Messages that carry none of these pass with one dictionary look-up.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Final

from overlay.channels.groups import MAX_WEIGHT, MILLI, GroupState
from overlay.channels.predicates import Filter
from overlay.channels.routing_table import RouteEntry
from overlay.channels.schema import Kind, Schema, Value
from overlay.channels.space import EventSpace, RangeConstraint
from overlay.channels.subscriptions import Subscription as StoredSubscription
from overlay.errors import RemoteProtocolError, SchemaError
from overlay.messages import peer as pm

__all__ = ["check_peer_message"]

# Node ids on the wire (``messages.peer.NodeId``).
MAX_NODE_ID: Final = 65535


class _Bad(Exception):
    """Inside this module: what is wrong, before the message is named."""


def _filter(f: Filter, schema: Schema) -> None:
    if not f.predicates:
        raise _Bad("a filter without a predicate")
    for p in f.predicates:
        try:
            p.check(schema)
        except SchemaError as exc:
            raise _Bad(f"predicate {p.attr!r} {p.op.value}: {exc}") from None
    try:
        # Decided here, where a refusal is clean: patterns too intricate to
        # decide (overlay.channels.strings rule 4) would fail in the matcher.
        f.satisfiable(schema)
    except SchemaError as exc:
        raise _Bad(f"a filter: {exc}") from None


def _event(values: dict[str, Value], schema: Schema) -> None:
    """Rule 3, on every Event: ``Schema.valid_event`` (its rule 6: one pass,
    no new dict)."""
    try:
        schema.valid_event(values)
    except SchemaError as exc:
        raise _Bad(f"event: {exc}") from None


def _space(space: EventSpace, schema: Schema) -> None:
    names = tuple(c.attr for c in space.constraints)
    if names != schema.da:
        raise _Bad(f"a space must constrain {', '.join(schema.da)} in that order, not {', '.join(map(str, names))}")
    for c in space.constraints:
        attr = schema.attributes[c.attr]
        if isinstance(c, RangeConstraint) != (attr.kind is not Kind.STRING):
            raise _Bad(f"a {type(c).__name__} does not apply to {attr.kind.value} attribute {attr.name!r}")
        if isinstance(c, RangeConstraint):
            iv = c.interval
            for end in (iv.lo, iv.hi):
                if not math.isfinite(end) or not attr.min <= end <= attr.max:
                    raise _Bad(f"space bound {end} of {attr.name!r} is outside [{attr.min}, {attr.max}]")
            if iv.lo > iv.hi:
                raise _Bad(f"space interval of {attr.name!r} has lo {iv.lo} above hi {iv.hi}")


def _route(entry: RouteEntry, schema: Schema) -> None:
    if not entry.owners or not all(0 <= n <= MAX_NODE_ID for n in entry.owners):
        raise _Bad(f"a route needs one or more node ids, got {list(entry.owners)}")
    _space(entry.space, schema)


def _weight(w: float, what: str) -> None:
    if not (math.isfinite(w) and 0 < w <= MAX_WEIGHT):
        raise _Bad(f"{what} weight {w} is outside (0, {MAX_WEIGHT:g}]")


def _stored(subs: Iterable[StoredSubscription], schema: Schema) -> None:
    for s in subs:
        _filter(s.filter, schema)
        _weight(s.weight, f"subscription {s.id!r}")
        if not 0 <= s.access_node <= MAX_NODE_ID:
            raise _Bad(f"subscription {s.id!r} names access node {s.access_node}")


def _groups(groups: Iterable[GroupState]) -> None:
    for g in groups:
        for name, inst in g.instances.items():
            if not 0 < inst.ws <= MAX_WEIGHT * MILLI or not 0 <= inst.lf <= MILLI:
                raise _Bad(
                    f"group {g.name!r} instance {name!r}: weight {inst.ws} or load factor {inst.lf} out of range"
                )
            if not math.isfinite(inst.faulty_until):
                raise _Bad(f"group {g.name!r} instance {name!r}: faulty_until {inst.faulty_until}")


def _subscription(msg: pm.Subscription, schema: Schema) -> None:
    _filter(msg.sub_exp, schema)


def _unsubscription(msg: pm.UnSubscription, schema: Schema) -> None:
    _filter(msg.unsub_exp, schema)


def _event_message(msg: pm.Event, schema: Schema) -> None:
    _event(msg.event_exp, schema)
    if not math.isfinite(msg.publish_time):  # it goes on in every Notification, to every subscriber
        raise _Bad(f"publish_time {msg.publish_time}")


def _table(msg: pm.RoutingTableInit, schema: Schema) -> None:
    for item in msg.routing_table:
        _route(item.entry, schema)


def _update(msg: pm.UpdateRoutingTable, schema: Schema) -> None:
    for item in msg.update_chs:
        _route(item.entry, schema)


def _transfer(msg: pm.ChannelTransfer, schema: Schema) -> None:
    for spec in msg.channels:
        _space(spec.space, schema)
        if not all(math.isfinite(p.left) for p in spec.past_owners):
            raise _Bad(f"channel {spec.ch_id}: a past owner's time is not finite")


def _move(msg: pm.SubscriptionMove, schema: Schema) -> None:
    for chs in msg.ch_sub_set:
        _stored(chs.subscriptions, schema)
        _groups(chs.groups)


def _rebuild(msg: pm.Rebuild, schema: Schema) -> None:
    _stored(msg.subscriptions, schema)


def _handover(msg: pm.DeliveryHandover, schema: Schema) -> None:
    for rec in msg.deliveries:
        _event_message(rec.event, schema)


def _reforward(msg: pm.Reforward, schema: Schema) -> None:
    for item in msg.messages:
        _CHECKS[type(item.message)](item.message, schema)


_CHECKS: Final[dict[type, Callable[..., None]]] = {
    pm.Subscription: _subscription,
    pm.UnSubscription: _unsubscription,
    pm.Event: _event_message,
    pm.RoutingTableInit: _table,
    pm.UpdateRoutingTable: _update,
    pm.ChannelTransfer: _transfer,
    pm.SubscriptionMove: _move,
    pm.Rebuild: _rebuild,
    pm.Reforward: _reforward,
    pm.DeliveryHandover: _handover,
}


def check_peer_message(msg: pm.PeerMessage, schema: Schema) -> None:
    """Rules 1–6: return if ``msg`` may reach the components, else raise ``RemoteProtocolError``."""
    check = _CHECKS.get(type(msg))
    if check is None:
        return
    try:
        check(msg, schema)
    except _Bad as exc:
        raise RemoteProtocolError(f"{type(msg).__name__}: {exc}") from None
