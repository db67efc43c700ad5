"""The message bus shared by every rockbot process (see `interface` for the delivery rules).

`MemoryBroker` (and its per-principal `MemoryBus` connections) runs inside one process (local
mode, tests); `AmqpBus` on RabbitMQ. Who may do what is `identity` and `permissions`; queue names
live in `topology`; creating users and queues is `admin`.
"""

from rockbot.bus.amqp import AmqpBus
from rockbot.bus.errors import (
    AccessRefused,
    BadMessage,
    BusError,
    BusUnavailable,
    InUse,
    Nacked,
    NoRoute,
    NotAccepted,
    Refused,
    RequestTimeout,
    TooLarge,
)
from rockbot.bus.identity import CONSOLE, GATEWAY, LOCAL, OPERATOR, SCRIPTS_MANAGER, Principal
from rockbot.bus.interface import Bus, Handler, Subscription
from rockbot.bus.memory import MemoryBroker, MemoryBus
from rockbot.bus.messages import Delivery, ReplyAddress, RequestAccepted
from rockbot.bus.permissions import Permissions, permissions_for
from rockbot.bus.topology import Queue

__all__ = [
    "CONSOLE",
    "GATEWAY",
    "LOCAL",
    "OPERATOR",
    "SCRIPTS_MANAGER",
    "AccessRefused",
    "AmqpBus",
    "BadMessage",
    "Bus",
    "BusError",
    "BusUnavailable",
    "Delivery",
    "Handler",
    "InUse",
    "MemoryBroker",
    "MemoryBus",
    "Nacked",
    "NoRoute",
    "NotAccepted",
    "Permissions",
    "Principal",
    "Queue",
    "Refused",
    "ReplyAddress",
    "RequestAccepted",
    "RequestTimeout",
    "Subscription",
    "TooLarge",
    "permissions_for",
]
