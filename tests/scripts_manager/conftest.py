"""Shared pieces for the scripts-manager tests: settings that keep everything on loopback."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from rockbot.scripts_manager.settings import ScriptsManagerSettings

MakeSettings = Callable[..., ScriptsManagerSettings]


@pytest.fixture
def make_settings(tmp_path_factory: pytest.TempPathFactory) -> MakeSettings:
    def make(**overrides: object) -> ScriptsManagerSettings:
        values: dict[str, object] = {
            "health_host": "127.0.0.1",
            "health_port": 0,
            "scripts_backend": "local",
            "drain_seconds": 0.0,
            "scripts_package_cache": tmp_path_factory.mktemp("packages"),
        }
        values.update(overrides)
        return ScriptsManagerSettings(**values)  # type: ignore[arg-type]

    return make
