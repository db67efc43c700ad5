"""Run the real operator (`run_operator`) in its own thread and event loop, and wait on the API."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator
from typing import Any, TypeVar

from rockbot.operator.runner import run_operator
from rockbot.operator.settings import OperatorSettings

T = TypeVar("T")


@contextlib.asynccontextmanager
async def operator_running(
    settings: OperatorSettings, *, within: float = 30.0, health_endpoint: str | None = None
) -> AsyncIterator[None]:
    """The operator as `rockbot operator` runs it, against the `kubeconfig` fixture's API server (with
    `health_endpoint`, serving /healthz, /readyz and /metrics there)."""
    stop_flag, ready_flag = threading.Event(), threading.Event()
    failures: list[BaseException] = []

    def operate() -> None:
        try:
            asyncio.run(run_operator(settings, stop_flag=stop_flag, ready_flag=ready_flag,
                                     health_endpoint=health_endpoint))
        except BaseException as error:
            failures.append(error)
            ready_flag.set()

    thread = threading.Thread(target=operate, name="rockbot-operator", daemon=True)
    thread.start()
    try:
        assert await asyncio.to_thread(ready_flag.wait, within), "the operator did not start"
        if failures:
            raise RuntimeError("the operator failed to start") from failures[0]
        yield
    finally:
        stop_flag.set()
        await asyncio.to_thread(thread.join, within)
    assert not thread.is_alive(), "the operator did not stop"
    if failures:
        raise RuntimeError("the operator failed") from failures[0]


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    found = [c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == type_]
    assert found, f"no {type_} condition yet"
    return found[0]
