"""What a process's readiness said at chosen moments of its start-up (a pod reported ready too early gets traffic
its ports refuse)."""

from __future__ import annotations

from types import ModuleType

import pytest

from rockbot.health import Readiness


def record_readiness(monkeypatch: pytest.MonkeyPatch, module: ModuleType) -> list[Readiness]:
    """Every `Readiness` that `module` makes from now on, for the test to ask at chosen moments."""
    made: list[Readiness] = []

    class Recorded(Readiness):
        def __init__(self) -> None:
            super().__init__()
            made.append(self)

    monkeypatch.setattr(module, "Readiness", Recorded)
    return made
