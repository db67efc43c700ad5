"""`rockbot console` as a process starts it: ready for its Service only once it answers."""

from __future__ import annotations

from pathlib import Path

import pytest
from aiohttp import web

from rockbot.console import service as console_service
from rockbot.console.service import Console
from rockbot.console.settings import ConsoleSettings
from tests.readiness import record_readiness


async def test_the_console_is_ready_only_once_it_serves_its_pages(
    real_kubeconfig: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    made = record_readiness(monkeypatch, console_service)
    said_before_serving: list[list[str]] = []

    class Observed(web.TCPSite):  # the pages' site (and the health server's, which comes first)
        async def start(self) -> None:
            (readiness,) = made
            said_before_serving.append(readiness.reasons())
            await super().start()

    monkeypatch.setattr(web, "TCPSite", Observed)
    console = Console(settings=ConsoleSettings(database_url=f"sqlite:///{tmp_path / 'runs.db'}", http_host="127.0.0.1",
                                               http_port=0, health_host="127.0.0.1", health_port=0))
    try:
        await console.start()
        assert len(said_before_serving) == 2 and all(said_before_serving), said_before_serving
        assert console.readiness.reasons() == []
    finally:
        await console.stop()
