"""The message engine: channels, delivery, acknowledgments, dead letters.

    from bus import Bus
    with Bus.open(".worker-state/bus.db") as bus:
        ch = bus.channels                      # a `Channels` on this bus
        ch.create_channel("ci-events", "pubsub", "ci-agent")

The modules, lowest first: `topics` (wildcard matching), `store` (channels,
participants, subscriptions and their SQL), `queries` (filters and the
`ChannelMessage` a receiver gets), `sending` (validate, route, persist),
`system` (the bus's own `_system` channel of notices), `delivery`
(receive, acknowledge, retries on a clock), `deadletters`, and `engine`,
the `Channels` facade. The engine
stores its messages in the log's `messages` table (addressed to `#channel`)
and knows nothing of the pump or the CLI.
"""

from __future__ import annotations

from bus.channels.deadletters import DeadLetter
from bus.channels.engine import Channels
from bus.channels.engine import StoreLimits
from bus.channels.queries import ChannelMessage
from bus.channels.queries import Delivery
from bus.channels.queries import MessageFilter
from bus.channels.queries import QueryResult
from bus.channels.store import Channel
from bus.channels.store import ChannelConfig
from bus.channels.store import Participant

__all__ = [
    "Channel", "ChannelConfig", "ChannelMessage", "Channels", "DeadLetter", "Delivery",
    "MessageFilter", "Participant", "QueryResult", "StoreLimits",
]
