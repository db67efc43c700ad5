"""Stopping a service's background tasks: one way, used by every service.

`task.cancel()` then `with suppress(CancelledError): await task` also swallows a cancellation of the
task that does the stopping, when it comes while that task waits: a shutdown bounded by a timeout,
or a caller that gave up, then goes on as if nothing had been asked. Gathering the cancelled tasks
instead lets such a cancellation through, once every task has ended.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

log = logging.getLogger(__name__)


async def cancel_and_wait(*tasks: asyncio.Task[Any] | None) -> None:
    """Cancel `tasks` (None: never started) and return once each has ended.

    A task that had failed before it was stopped is logged, not raised: it is being stopped either way,
    and its failure would otherwise go unseen (nothing else awaits it).
    """
    started = [task for task in tasks if task is not None]
    for task in started:
        task.cancel()
    outcomes = await asyncio.gather(*started, return_exceptions=True)
    for task, outcome in zip(started, outcomes, strict=True):
        if isinstance(outcome, Exception):
            log.warning("%s had failed before it was stopped: %r", task.get_name(), outcome, exc_info=outcome)
