"""Waiting on an eventually consistent system without sleeping a fixed time."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from rockbot.kube import NotFound

T = TypeVar("T")


async def eventually(probe: Callable[[], Awaitable[T]], *, within: float = 15.0) -> T:
    """Poll until `probe` stops failing an assertion or finding nothing (no object, no field yet).

    Re-raises the last failure when `within` seconds pass.
    """
    deadline = asyncio.get_running_loop().time() + within
    while True:
        try:
            return await probe()
        except (AssertionError, NotFound, LookupError):
            if asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.02)


async def bounded(awaitable: Awaitable[T], *, within: float, what: str) -> T:
    """Await `awaitable` for at most `within` seconds; past that, fail naming `what` was awaited."""
    try:
        async with asyncio.timeout(within):
            return await awaitable
    except TimeoutError:
        raise AssertionError(f"waited {within:g} s for {what}, in vain") from None
