"""The message bus shared by every rockbot process (see `interface` for the delivery rules).

`MemoryBus` runs inside one process (local mode, tests); `AmqpBus` on RabbitMQ. Queue names live
in `topology`.
"""

from rockbot.bus.amqp import AmqpBus
from rockbot.bus.errors import BadMessage, BusError, BusUnavailable, NoRoute, RequestTimeout
from rockbot.bus.interface import Bus, Handler, Subscription
from rockbot.bus.memory import MemoryBus
from rockbot.bus.messages import Delivery
from rockbot.bus.topology import Queue

__all__ = [
    "AmqpBus",
    "BadMessage",
    "Bus",
    "BusError",
    "BusUnavailable",
    "Delivery",
    "Handler",
    "MemoryBus",
    "NoRoute",
    "Queue",
    "RequestTimeout",
    "Subscription",
]

