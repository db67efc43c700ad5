"""Issue 35's "done when" on the real node: a code interpreter over A2A with the chart's default script image. A
`FilePart` CSV goes in, a PerConversation session loads it with pandas in one call and charts it with matplotlib in
the next (relying on the first call's variable, in the same session pod), the cleaned CSV and the chart come back as
artifacts of the A2A answer, and `rockbot runs files RUN --out DIR` saves them from the console."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from a2a.types.a2a_pb2 import Part, TaskState

from e2e.conftest import Agent, Release, agent_manifest, until, wait_for_agent
from e2e.test_runs import reader, rockbot_runs, service_url  # noqa: F401 (reader: the fixture)
from rockbot.console.runs_cli import HttpRuns
from rockbot.console.store_models import RunFilter
from tests.agent.test_a2a import a2a_client, answer_of
from tests.agent.test_a2a_files import with_files
from tests.fixtures.llm import ScriptedLLM

SALES = b"month,revenue\n2026-01,10\n2026-02,\n2026-03,12\n2026-04,9\n"
LOAD = """
import socket
import pandas as pd
sales = pd.read_csv("/input/sales.csv").dropna()
sales["revenue"] = sales.revenue.astype(int)
sales.to_csv("/output/clean.csv", index=False)
print(len(sales), "rows kept in", socket.gethostname())
"""
CHART = """
import matplotlib.pyplot as plt
sales.plot(x="month", y="revenue", kind="bar", legend=False)
plt.show()
print("total", sales.revenue.sum(), "in", socket.gethostname())
"""
CLEAN = b"month,revenue\n2026-01,10\n2026-03,12\n2026-04,9\n"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def analyst(release: Release) -> Iterator[Agent]:
    """An Agent of the release that keeps a script session per conversation."""
    name = "e2e-analyst"
    manifest = agent_manifest(name=name, model_url=release.model_url)
    manifest["spec"]["scriptSessions"] = {"mode": "PerConversation", "idleSeconds": 300, "maxSeconds": 3600}
    release.kubectl.apply(manifest, namespace=release.namespace)
    try:
        wait_for_agent(release.kubectl, name=name, namespace=release.namespace)
        yield Agent(name=name, namespace=release.namespace, kubectl=release.kubectl)
    finally:
        release.kubectl.run("delete", "agent", name, "-n", release.namespace, "--ignore-not-found", check=False)


def test_a_csv_over_a2a_is_loaded_then_charted_in_one_session_and_its_files_come_back(
    analyst: Agent, model: ScriptedLLM, release: Release, reader: str, tmp_path: Path  # noqa: F811
) -> None:
    model.play(
        {"tool_calls": [{"name": "execute_python_script", "arguments": {"script": LOAD}}]},
        {"tool_calls": [{"name": "execute_python_script", "arguments": {"script": CHART}}]},
        {"text": "Cleaned and charted."},
    )  # fmt: skip
    kubectl = release.kubectl
    token = kubectl.secret(f"rockbot-{analyst.name}-http-token", "token", namespace=analyst.namespace)

    async def send():
        async with a2a_client(service_url(kubectl, f"rockbot-{analyst.name}", analyst.namespace), token=token,
                              streaming=False) as client:  # fmt: skip
            request = with_files("Clean this and chart revenue by month.",
                                 Part(raw=SALES, filename="sales.csv", media_type="text/csv"))
            [event] = [event async for event in client.send_message(request)]
            return event.task

    task = asyncio.run(send())

    assert task.status.state == TaskState.TASK_STATE_COMPLETED, task.status
    by_id = {artifact.artifact_id: artifact for artifact in task.artifacts}
    assert answer_of(type(task)(artifacts=[by_id.pop("answer")])).startswith("Cleaned and charted."), task
    made = {a.parts[0].filename: (a.parts[0].media_type, a.parts[0].raw) for a in by_id.values()}
    assert sorted(made) == ["clean.csv", "figure-1.png"], made
    assert made["clean.csv"] == ("text/csv", CLEAN)
    assert made["figure-1.png"][0] == "image/png" and made["figure-1.png"][1].startswith(PNG_MAGIC)
    load, chart = [m["content"] for m in model.requests[-1].messages if m.get("role") == "tool"]
    assert "3 rows kept" in load and "clean.csv" in load, load
    assert "total 31" in chart and "figure-1.png" in chart and "clean.csv" not in chart, chart
    pods = re.findall(r" in (rockbot-script-[0-9a-f]+-[0-9a-f]+)", load + chart)
    assert len(pods) == 2 and len(set(pods)) == 1, (load, chart)  # one session pod served both calls

    console = service_url(kubectl, f"{release.name}-console", release.namespace)

    async def the_run() -> str | None:
        api = HttpRuns(url=console, token=reader)
        try:
            page = await api.list_runs(filters=RunFilter(namespace=analyst.namespace, agent=analyst.name,
                                                         session_id=task.context_id), limit=5)  # fmt: skip
        finally:
            await api.close()
        done = [run.run_id for run in page.runs if run.outcome == "Succeeded"]
        return done[0] if done else None

    run_id = until("the conversation's run recorded", lambda: asyncio.run(the_run()), within=60)
    listed = rockbot_runs("files", run_id, "--out", str(tmp_path), url=console, token=reader)
    assert "clean.csv" in listed and "figure-1.png" in listed, listed
    assert (tmp_path / "clean.csv").read_bytes() == CLEAN
    assert (tmp_path / "figure-1.png").read_bytes() == made["figure-1.png"][1]
    assert (tmp_path / "sales.csv").read_bytes() == SALES  # the A2A upload is kept with the turn's run
