"""A first end-to-end pass over the content model; detailed tests live per module."""

from overlay.channels import EventSpace, SubscriptionIndex, Subscription, parse_event, parse_subscription


def test_subscription_matches_event_through_the_index(schema):
    f = parse_subscription('price >= 10 and price < 20 and sym prefix "AB"', schema)
    e = parse_event('{sym: "ABC", price: 12.5, qty: 3, tag: 48.1.2.3}', schema)
    assert f.matches(e)
    ix = SubscriptionIndex(schema)
    ix.add(Subscription("s1", f))
    matched, tested = ix.match(e)
    assert [s.id for s in matched] == ["s1"]
    assert tested == 1
    assert EventSpace.whole(schema).contains(e)
