"""`rockbot local` records every turn in its SQLite run store, and a conversation continues in a new local run."""

from __future__ import annotations

import pathlib

from rockbot.console.store import Store
from rockbot.console.store_models import RunFilter
from rockbot.local import broker
from rockbot.local.app import running
from rockbot.local.assembly import LocalModel, assemble
from rockbot.local.manifests import load
from rockbot.scripts_manager.settings import ScriptsManagerSettings
from tests.fixtures.llm import Turn

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"


async def _chat(folder: pathlib.Path, llm, database: pathlib.Path, text: str) -> str:
    manifests = load([folder])
    agents = assemble(manifests, model=LocalModel(base_url=llm.url, name=llm.model, api_key_env=None))
    scripts = ScriptsManagerSettings(scripts_backend="local", health_host="127.0.0.1", health_port=0)
    connect = await broker.in_memory([assembled.config for assembled in agents.values()])
    async with running(connect=connect, agents=agents, tasks=[], report=lambda *_: None, scripts=scripts,
                       runs_database=database) as local:  # fmt: skip
        result = await local.agents["analyst"].chat("s", text, caller="service.local")
    return result.answer


async def test_local_turns_are_runs_in_sqlite_and_conversations_continue(scripted_llm, tmp_path) -> None:
    (tmp_path / "analyst.yaml").write_text((EXAMPLES / "analyst.yaml").read_text())
    database = tmp_path / "runs.db"
    scripted_llm.play(Turn(text="Hello Ann."), Turn(text="You are Ann."))

    assert await _chat(tmp_path, scripted_llm, database, "I am Ann.") == "Hello Ann."
    assert await _chat(tmp_path, scripted_llm, database, "Who am I?") == "You are Ann."  # a new process's memory

    assert [m.get("content") for m in scripted_llm.requests[1].messages[1:]] == ["I am Ann.", "Hello Ann.", "Who am I?"]
    store = await Store.open(url=f"sqlite:///{database}")
    try:
        page = await store.list_runs(filters=RunFilter(agent="analyst"))
        assert [run.outcome for run in page.runs] == ["Succeeded", "Succeeded"]
        assert page.runs[0].caller == "service.local" and page.runs[0].session_id == "s"
    finally:
        await store.close()
