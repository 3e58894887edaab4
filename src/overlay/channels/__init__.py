"""The content model: schema, expressions, event spaces, channels, tables, matching.

Pure Python, no I/O (SPEC §2, §2.3–2.4, §5).
"""

from overlay.channels.channel import Channel, ChannelId, EventRecord, SliceStats
from overlay.channels.dnf import Expression
from overlay.channels.expressions import parse_event, parse_expression, parse_subscription
from overlay.channels.intervals import Interval, IntervalSet
from overlay.channels.local_table import LocalTable
from overlay.channels.matcher import LinearMatcher, SubscriptionIndex
from overlay.channels.predicates import Filter, Op, Predicate, StringConj, compile_filter
from overlay.channels.routing_table import RouteEntry, RoutingTable
from overlay.channels.schema import Attribute, Kind, Schema, Value, format_rfid, parse_rfid
from overlay.channels.space import (
    Constraint,
    EventSpace,
    ExceptConstraint,
    RangeConstraint,
    SetConstraint,
)
from overlay.channels.subscriptions import Event, Subscription

__all__ = [
    "Attribute",
    "Channel",
    "ChannelId",
    "Constraint",
    "Event",
    "EventRecord",
    "EventSpace",
    "ExceptConstraint",
    "Expression",
    "Filter",
    "Interval",
    "IntervalSet",
    "Kind",
    "LinearMatcher",
    "LocalTable",
    "Op",
    "Predicate",
    "RangeConstraint",
    "RouteEntry",
    "RoutingTable",
    "Schema",
    "SetConstraint",
    "SliceStats",
    "StringConj",
    "Subscription",
    "SubscriptionIndex",
    "Value",
    "compile_filter",
    "format_rfid",
    "parse_event",
    "parse_expression",
    "parse_rfid",
    "parse_subscription",
]
