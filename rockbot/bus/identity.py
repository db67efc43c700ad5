"""Who is on the bus: a broker user name IS the principal, validated by the broker on every message.

Every process connects with its own broker user and stamps that name on each message it publishes
(AMQP `user_id`); RabbitMQ refuses a message whose `user_id` differs from the connection's user, so
a consumer reads the sender from `Delivery.user_id` and never from a field the sender wrote.

| principal                   | who                                                     |
| --------------------------- | ------------------------------------------------------- |
| `agent.<namespace>.<name>`  | the pods of one Agent                                   |
| `service.operator`          | the operator (scheduled runs, scheduling requests)      |
| `service.scripts-manager`   | the scripts-manager (the only reader of script.invoke)  |
| `service.gateway`           | the gateway (Trigger runs: webhooks, Kubernetes events) |
| `service.local`             | `rockbot local` (its ScheduledTasks, Triggers and chat) |
| `service.console`           | the console (writes run events, answers histories)      |
| `service.<name>`            | any other platform service (tests)                      |

Namespaces and names are DNS labels (no dots), so a user name splits back into its parts exactly.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")

Kind = Literal["agent", "service"]


@dataclass(frozen=True, order=True)
class Principal:
    """An identity on the bus; build it with `agent()`, `service()` or `parse()`."""

    kind: Kind
    name: str
    namespace: str = ""

    def __post_init__(self) -> None:
        if self.kind == "agent" and not _LABEL.match(self.namespace):
            raise ValueError(f"namespace={self.namespace!r} is not a DNS label (a-z, 0-9, '-', at most 63)")
        if self.kind == "service" and self.namespace:
            raise ValueError("a service principal has no namespace")
        if not _LABEL.match(self.name):
            raise ValueError(f"name={self.name!r} is not a DNS label (a-z, 0-9, '-', at most 63)")

    @classmethod
    def agent(cls, *, namespace: str, name: str) -> Principal:
        return cls(kind="agent", namespace=namespace, name=name)

    @classmethod
    def service(cls, name: str) -> Principal:
        return cls(kind="service", name=name)

    @classmethod
    def parse(cls, user: str | None) -> Principal | None:
        """The principal a broker user name stands for, or None when it is not one of ours."""
        parts = (user or "").split(".")
        try:
            if len(parts) == 3 and parts[0] == "agent":
                return cls.agent(namespace=parts[1], name=parts[2])
            if len(parts) == 2 and parts[0] == "service":
                return cls.service(parts[1])
        except ValueError:
            return None
        return None

    @property
    def user(self) -> str:
        """The broker user name."""
        return f"agent.{self.namespace}.{self.name}" if self.kind == "agent" else f"service.{self.name}"

    @property
    def agent_id(self) -> str:
        """`namespace/name` of an agent, as call chains and scheduling requests name it."""
        if self.kind != "agent":
            raise ValueError(f"{self.user} is not an agent")
        return f"{self.namespace}/{self.name}"

    def __str__(self) -> str:
        return self.user


OPERATOR = Principal.service("operator")
SCRIPTS_MANAGER = Principal.service("scripts-manager")
GATEWAY = Principal.service("gateway")
LOCAL = Principal.service("local")
CONSOLE = Principal.service("console")
