"""Asking the console over the bus: the one way an agent's history, memory and file requests go there."""

from __future__ import annotations

import secrets
from typing import Any, TypeVar

from pydantic import BaseModel

from rockbot.bus.identity import CONSOLE

Answer = TypeVar("Answer", bound=BaseModel)


async def ask_console(bus: Any, *, queue: str, body: BaseModel, answer: type[Answer], kind: str,
                      timeout_seconds: float) -> Answer:  # fmt: skip
    """The console's answer to `body` on `queue`: taken on this process's own reply queue and believed only from the
    console's login (`service.console`); a `BusError` (a timeout among them) when none comes."""
    reply = await bus.request(
        queue=queue, body=body, reply_queue=await bus.own_replies(), correlation_id=f"{kind}-{secrets.token_hex(8)}",
        timeout_seconds=timeout_seconds, responder=CONSOLE,
    )  # fmt: skip
    return reply.decode(answer)
