"""Every integer a peer sends is bounded at the codec (``overlay.messages.peer_base``
rule 3), the sentinels too: a node id where -1 means none (a key's home, a
notification's origin, a table update's dead node), a port, a hop count, a
rank, a session or slice number.  They were plain ``int``: a peer frame with
1e18 or -5 there decoded, and the node acted on it (an ``AddPeer`` with port
1e18 for its shell to dial, receipts for node 1e18, a Notify of rank -5 for a
client to choke on).  Now the frame is refused as the link's protocol error,
and the node goes on serving."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from conftest import LOCAL
from coreworld import EC, SCHEMA
from overlay.channels import parse_subscription
from overlay.errors import RemoteProtocolError
from overlay.messages import peer as pm
from overlay.messages.codec import encode_frame, peer_reader
from overlay.testing import WAIT, LoopbackCluster, dial_peer

pytestmark = pytest.mark.timeout(60)

DISPATCHED = pm.DispatchSign.EVENT_DISPATCHED
VALUES = {"price": 1.0, "sym": "A"}
FILTER = parse_subscription("price < 5", SCHEMA)

# field -> a message with that field set to the value given.
MESSAGES: dict[str, Callable[[int], pm.PeerMessage]] = {
    "Event.home": lambda v: pm.Event("1-1-1", VALUES, 1, DISPATCHED, EC, 1.0, key="k", rank=1, home=v),
    "Event.hops": lambda v: pm.Event("1-1-1", VALUES, 1, DISPATCHED, EC, 1.0, hops=v),
    "Subscription.hops": lambda v: pm.Subscription("s", FILTER, "c", 1, pm.DispatchSign.SUBSCRIBE_NEW, EC, hops=v),
    "Notification.origin": lambda v: pm.Notification("1-1-1", VALUES, ("0:1:x:1",), EC, 1.0, origin=v),
    "Notification.home": lambda v: pm.Notification("1-1-1", VALUES, ("0:1:x:1",), EC, 1.0, "k", 1, home=v),
    "Notification.rank": lambda v: pm.Notification("1-1-1", VALUES, ("0:1:x:1",), EC, 1.0, "k", rank=v, home=1),
    "UpdateRoutingTable.dead": lambda v: pm.UpdateRoutingTable((), (), 5, 1, dead=v),
    "UpdateRoutingTable.session": lambda v: pm.UpdateRoutingTable((), (), v, 1),
    "LIEM.slice_no": lambda v: pm.LIEM(1, "STABLE", 0.0, 0.0, 1.0, v),
    "RequestLoadBalance.session": lambda v: pm.RequestLoadBalance(0.0, 0.0, session=v),
    "PeerHello.port": lambda v: pm.PeerHello(7, "local", True, host="127.0.0.1", port=v),
    "PeerHello.admin_port": lambda v: pm.PeerHello(7, "local", True, host="127.0.0.1", port=7000, admin_port=v),
}
SENTINELS = {"home", "origin", "dead"}
COUNTERS = {"session", "slice_no"}


def bounds(field: str) -> tuple[int, int]:
    """The smallest and the largest value ``field`` takes."""
    name = field.split(".")[1]
    if name in COUNTERS:
        return 0, (1 << 63) - 1
    if name == "rank":
        return 0, 1 << 53  # messages.client.MAX_RANK
    return (-1 if name in SENTINELS else 0), (255 if name == "hops" else 65535)


def decode(msg: pm.PeerMessage) -> pm.PeerMessage:
    (out,) = peer_reader().feed(encode_frame(msg))
    return out


@pytest.mark.parametrize("field", MESSAGES)
@pytest.mark.parametrize("absurd", ["1e18", "-5", "below", "above"])
def test_an_absurd_value_is_refused_at_decode(field: str, absurd: str) -> None:
    lowest, largest = bounds(field)
    value = {"1e18": 10**18, "-5": -5, "below": lowest - 1, "above": largest + 1}[absurd]
    if lowest <= value <= largest:  # 1e18 is a plausible counter (sessions, slices): past 2^63 is not
        value = 1 << 63
    with pytest.raises(RemoteProtocolError, match="invalid message: Expected `int`"):
        decode(MESSAGES[field](value))


@pytest.mark.parametrize("field", MESSAGES)
def test_every_value_in_bounds_still_decodes(field: str) -> None:
    make = MESSAGES[field]
    for value in bounds(field):
        assert decode(make(value)) == make(value)


async def test_a_peer_sending_one_is_refused_and_the_node_goes_on_serving() -> None:
    async with LoopbackCluster(LOCAL, 2) as cl:
        reader, writer = await dial_peer(cl.config, 9, 0)
        writer.write(encode_frame(pm.PeerHello(9, "local", True)))
        writer.write(encode_frame(MESSAGES["Notification.origin"](10**18)))
        frames = peer_reader()
        got: list[pm.PeerMessage] = []
        while data := await asyncio.wait_for(reader.read(65536), WAIT):
            got += frames.feed(data)
        writer.close()
        (refusal,) = [m for m in got if type(m) is pm.PeerError]
        assert refusal.code == "protocol_error" and "<= 65535" in refusal.message
        assert cl.nodes[0].core.stats["rejected_peer_protocol"] == 1
        sub = await (await cl.client(1)).subscribe("price < 1000")
        await (await cl.client(0)).publish(VALUES)
        assert (await sub.next(WAIT)).event == VALUES
