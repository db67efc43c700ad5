"""`rockbot local` records every turn in its SQLite run store, and a conversation continues in a new local run."""

from __future__ import annotations

import json
import pathlib

import yaml

from rockbot.console.store import Store
from rockbot.console.store_models import RunFilter
from rockbot.local import broker
from rockbot.local.app import running
from rockbot.local.assembly import LocalModel, assemble
from rockbot.local.manifests import load
from rockbot.scripts_manager.settings import ScriptsManagerSettings
from tests.fixtures.llm import EMBEDDING_MODEL, ScriptedCall, Turn

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"


async def _chat(folder: pathlib.Path, llm, database: pathlib.Path, text: str, *, session: str = "s",
                caller: str = "service.local") -> str:
    manifests = load([folder])
    agents = assemble(manifests, model=LocalModel(base_url=llm.url, name=llm.model, api_key_env=None))
    scripts = ScriptsManagerSettings(scripts_backend="local", health_host="127.0.0.1", health_port=0)
    connect = await broker.in_memory([assembled.config for assembled in agents.values()])
    async with running(connect=connect, agents=agents, tasks=[], report=lambda *_: None, scripts=scripts,
                       runs_database=database) as local:  # fmt: skip
        result = await local.agents["analyst"].chat(session, text, caller=caller)
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


async def test_local_long_term_memory_outlives_the_process_and_stays_the_callers(scripted_llm, tmp_path) -> None:
    documents = list(yaml.safe_load_all((EXAMPLES / "analyst.yaml").read_text()))
    analyst = next(d for d in documents if d["kind"] == "Agent" and d["metadata"]["name"] == "analyst")
    analyst["spec"]["memory"] = {"longTerm": {"enabled": True, "embeddings": {"model": EMBEDDING_MODEL},
                                              "autoRecall": {"minScore": 0.2}}}
    (tmp_path / "analyst.yaml").write_text(yaml.safe_dump_all(documents))
    database = tmp_path / "runs.db"
    fact = "The staging database is called orca-staging."
    scripted_llm.play(Turn(tool_calls=[ScriptedCall(name="remember", arguments={"text": fact})]), Turn(text="Kept."),
                      Turn(text="orca-staging"), Turn(text="I do not know."))  # fmt: skip

    assert await _chat(tmp_path, scripted_llm, database, "Remember the staging database's name.") == "Kept."
    assert await _chat(tmp_path, scripted_llm, database, "What is the staging database called?",
                       session="t") == "orca-staging"  # a new process, a new conversation
    assert json.dumps(fact) in scripted_llm.requests[-1].messages[-1]["content"]
    assert await _chat(tmp_path, scripted_llm, database, "What is the staging database called?", session="t",
                       caller="service.someone-else") == "I do not know."
    assert fact not in json.dumps(scripted_llm.requests[-1].messages)
