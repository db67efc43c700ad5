"""Fixtures shared by the agent's tests."""

from __future__ import annotations

import pytest

from rockbot.agent.toolsets import mcp_servers


@pytest.fixture
def patient_mcp_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """Let an agent's start wait up to a minute for its MCP servers instead of the product's 10 s.

    A stdio server is a Python process importing the MCP SDK: on a loaded 2-core test machine that
    alone can pass 10 s, and the agent would (rightly) start without the server's tools, failing a test
    about something else. Tests of the slow-start path set their own, shorter wait.
    """
    monkeypatch.setattr(mcp_servers, "STARTUP_WAIT_SECONDS", 60.0)
