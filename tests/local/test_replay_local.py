"""`rockbot replay` with `rockbot local`: a run of the example analyst (its script really run in the local sandbox,
recorded in the SQLite store) is replayed through the local console in recorded mode: the same script call gets the
recorded output and no script runs (the replay's run records no script run); with another script, the call is
reported as not run."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from rockbot.cli import main
from rockbot.console.store import Store
from rockbot.console.store_models import RunDetail, RunFilter
from tests.fixtures.llm import ScriptedLLM
from tests.local.test_local import EXAMPLES, sum_in_the_sandbox
from tests.local.test_terminal import Chat, local_console_of
from tests.waiting import eventually


@pytest.fixture
async def local(scripted_llm: ScriptedLLM, tmp_path: Path) -> AsyncIterator[tuple[str, Path, Chat]]:
    """`rockbot local` running the example analyst with its console on a free port: (its URL, the store, the chat)."""
    shutil.copy(EXAMPLES / "analyst.yaml", tmp_path / "analyst.yaml")
    async with local_console_of(scripted_llm, tmp_path / "analyst.yaml", tmp_path / "runs.db") as (url, chat):
        yield url, tmp_path / "runs.db", chat


async def _runs(database: Path) -> list[RunDetail]:
    """Every ended run of the store, oldest first."""
    store = await Store.open(url=f"sqlite:///{database}", migrate=False)
    try:
        page = await store.list_runs(filters=RunFilter(), limit=50)
        found = [await store.get_run(run.run_id) for run in reversed(page.runs)]
    finally:
        await store.close()
    assert all(run is not None and run.outcome for run in found)
    return found  # type: ignore[return-value]


async def test_a_local_run_replays_in_recorded_mode_without_running_its_script(
        local: tuple[str, Path, Chat], scripted_llm: ScriptedLLM, capsys: pytest.CaptureFixture[str]) -> None:
    url, database, terminal = local
    scripted_llm.play(*sum_in_the_sandbox([1, 2, 39], answer="The sum is 42."))
    terminal.process.stdin.write(b"add 1, 2 and 39\n")  # type: ignore[union-attr]
    await terminal.wait_for("[tools called: execute_python_script]", seconds=90)
    [original] = await eventually(lambda: _runs(database), within=30)
    [ran] = [e for e in original.timeline if e.kind == "script_run"]
    assert ran.data["stdout"] == "42\n"

    scripted_llm.play(*sum_in_the_sandbox([1, 2, 39], answer="The sum is 42."))
    code = await asyncio.to_thread(main, ["replay", original.run_id, "--url", url])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "differs:  nothing" in out
    assert "42" in scripted_llm.requests[-1].messages[-1]["content"]  # the recorded output answered the call

    scripted_llm.play(*sum_in_the_sandbox([5, 5], answer="Ten?"))
    code = await asyncio.to_thread(main, ["replay", original.run_id, "--url", url])
    out, err = capsys.readouterr()
    assert code == 3, err
    assert "NOT RUN" in out and "differs:  answer, tool call 1" in out

    _, same, other = await _runs(database)
    assert (same.source, same.parent_run_id, other.source) == ("replay", original.run_id, "replay")
    assert [e for e in same.timeline + other.timeline if e.kind == "script_run"] == []  # no script ran
