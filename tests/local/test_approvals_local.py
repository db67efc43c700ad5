"""`rockbot local` asks in the chat before a call that needs approval runs: `approve? [y/N]`."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.fixtures.llm import ScriptedCall, Turn
from tests.local.test_local import EXAMPLES, model_env

SUM = "print(sum([1, 2, 39]))\n"


async def local_chat(folder: Path, *, answer: str, env: dict[str, str],
                     console: tuple[str, ...] = ("--console-port", "0")) -> subprocess.CompletedProcess[str]:
    """`rockbot local --prompt` with `answer` typed at the terminal (stdin); its console on a free port."""
    clean = {key: value for key, value in os.environ.items() if not key.startswith("OPENAI_")}
    with tempfile.TemporaryDirectory() as state:
        return await asyncio.to_thread(
            subprocess.run, [sys.executable, "-m", "rockbot.cli", "local", *console, "-f", str(folder),
                             "--prompt", "sum it"],
            input=answer, capture_output=True, text=True, timeout=120,
            env={**clean, "XDG_STATE_HOME": state, **env},
        )  # fmt: skip


@pytest.fixture
def analyst_needing_approval(tmp_path: Path) -> Path:
    text = (EXAMPLES / "analyst.yaml").read_text().replace(
        "  scriptLimits: {timeoutSeconds: 30, cpu: 500m, memory: 256Mi}",
        "  scriptLimits: {timeoutSeconds: 30, cpu: 500m, memory: 256Mi}\n"
        "  approval: {tools: [execute_python_script], timeoutSeconds: 60}")
    (tmp_path / "analyst.yaml").write_text(text)
    return tmp_path


@pytest.mark.parametrize(("typed", "runs"), [("y\n", True), ("n\n", False), ("", False)])
async def test_the_chat_asks_before_a_script_runs(scripted_llm, analyst_needing_approval, typed, runs):
    call = ScriptedCall(name="execute_python_script", arguments={"script": SUM})
    scripted_llm.play(Turn(tool_calls=[call]), Turn(text="Done."))
    result = await local_chat(analyst_needing_approval, answer=typed, env=model_env(scripted_llm))
    assert result.returncode == 0, result.stderr
    assert "analyst wants to run execute_python_script" in result.stderr
    assert result.stdout.startswith("  approve? [y/N] ")  # the question, where the chat's prompt goes
    tool_answer = scripted_llm.requests[1].messages[-1]["content"]
    if runs:
        assert "42" in tool_answer
    else:
        error = json.loads(tool_answer)["error"]
        assert error["code"] == "Rejected" and "did not run" in error["message"]


async def test_without_the_console_the_terminal_alone_asks(scripted_llm, analyst_needing_approval):
    scripted_llm.play(Turn(tool_calls=[ScriptedCall(name="execute_python_script", arguments={"script": SUM})]),
                      Turn(text="Done."))
    result = await local_chat(analyst_needing_approval, answer="y\n", env=model_env(scripted_llm),
                              console=("--no-console",))
    assert result.returncode == 0, result.stderr
    assert "[console:" not in result.stderr and "analyst wants to run execute_python_script" in result.stderr
    assert "42" in scripted_llm.requests[1].messages[-1]["content"]
