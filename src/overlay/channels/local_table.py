"""``localTable``: the channels placed on this node (SPEC §2.4)."""

from __future__ import annotations

from collections.abc import Iterator

from overlay.channels.channel import Channel, ChannelId
from overlay.errors import LocalProtocolError

__all__ = ["LocalTable"]


class LocalTable:
    """The channels this node owns, and the counter that names new ones.

    Invariant: every key is its channel's id, and ids this node creates are
    ``(node_id, seq)`` with ``seq`` strictly increasing, never reused.
    """

    def __init__(self, node_id: int) -> None:
        self.node_id = node_id
        self._channels: dict[ChannelId, Channel] = {}
        self._next_seq = 0

    def new_id(self) -> ChannelId:
        chid = ChannelId(self.node_id, self._next_seq)
        self._next_seq += 1
        return chid

    def observe_id(self, chid: ChannelId) -> None:
        """Keep the counter past ids of ours seen elsewhere (e.g. after a restart)."""
        if chid.node == self.node_id and chid.seq >= self._next_seq:
            self._next_seq = chid.seq + 1

    def __len__(self) -> int:
        return len(self._channels)

    def __iter__(self) -> Iterator[Channel]:
        return iter(self._channels.values())

    def __contains__(self, chid: object) -> bool:
        return chid in self._channels

    def ids(self) -> list[ChannelId]:
        return list(self._channels)

    def get(self, chid: ChannelId) -> Channel | None:
        return self._channels.get(chid)

    def __getitem__(self, chid: ChannelId) -> Channel:
        try:
            return self._channels[chid]
        except KeyError:
            raise LocalProtocolError(f"channel {chid} is not on node {self.node_id}") from None

    def add(self, channel: Channel) -> None:
        if channel.id in self._channels:
            raise LocalProtocolError(f"channel {channel.id} is already on node {self.node_id}")
        self._channels[channel.id] = channel
        self.observe_id(channel.id)

    def remove(self, chid: ChannelId) -> Channel | None:
        return self._channels.pop(chid, None)

    @property
    def load(self) -> int:
        """``d_i``: the load of the slice in progress over all channels (SPEC §5)."""
        return sum(ch.load for ch in self._channels.values())
