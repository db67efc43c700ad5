"""Settings a scripts-manager refuses to start with, and why."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from tests.scripts_manager.conftest import MakeSettings


def test_script_and_input_caps_must_fit_in_one_job(make_settings: MakeSettings) -> None:
    assert make_settings(scripts_max_script_bytes=1024 * 1024, scripts_max_input_bytes=1024 * 1024)
    with pytest.raises(ValidationError) as refused:
        make_settings(scripts_max_script_bytes=1024 * 1024, scripts_max_input_bytes=1024 * 1024 + 1)
    message = str(refused.value)
    assert "ROCKBOT_SCRIPTS_MAX_SCRIPT_BYTES + ROCKBOT_SCRIPTS_MAX_INPUT_BYTES = 2097153 bytes" in message
    assert "lower one of them" in message
