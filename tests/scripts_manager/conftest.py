"""Shared pieces for the scripts-manager tests: settings that keep everything on loopback."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from rockbot.scripts_manager.settings import ScriptsManagerSettings

MakeSettings = Callable[..., ScriptsManagerSettings]


@pytest.fixture
def make_settings() -> Iterator[MakeSettings]:
    # A package cache of this test's own that the scripts' user (nobody, under root) can reach: pytest's
    # temporary folders are private to the user running the tests.
    packages = Path(tempfile.mkdtemp(prefix="rockbot-test-packages-"))
    packages.chmod(0o755)

    def make(**overrides: object) -> ScriptsManagerSettings:
        values: dict[str, object] = {
            "health_host": "127.0.0.1",
            "health_port": 0,
            "scripts_backend": "local",
            "drain_seconds": 0.0,
            "scripts_package_cache": packages,
        }
        values.update(overrides)
        return ScriptsManagerSettings(**values)  # type: ignore[arg-type]

    yield make
    shutil.rmtree(packages, ignore_errors=True)
