"""`rockbot eval from-runs`: recorded runs of a real SQLite run store as an Evaluation's cases, printed as YAML that
the Evaluation resource takes; a run that is no example of a good answer (failed, recorded without text, another
Agent's) is refused by name."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import yaml

from rockbot.cli import main
from rockbot.console.store import Batch, Store
from rockbot.resources import Evaluation
from tests.console.events import typical_run


async def _from_runs(*args: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = await asyncio.to_thread(main, ["eval", "from-runs", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


async def test_good_runs_become_cases_of_an_evaluation_of_their_agent(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    database = tmp_path / "runs.db"
    store = await Store.open(url=f"sqlite:///{database}")
    with_tools = typical_run(tools=2, question="Which tickets are open?")
    without = typical_run(tools=0, question="Say hello")
    failed = typical_run(outcome="Failed")
    metadata = typical_run(record="Metadata")
    other = typical_run(agent="other")
    await store.write(batches=[Batch(namespace="team-a", agent="other" if e is other else "triage",
                                     events=e) for e in (with_tools, without, failed, metadata, other)])
    await store.close()
    ids = [events[0].run_id for events in (with_tools, without, failed, metadata, other)]

    code, out, err = await _from_runs(ids[0], ids[1], "--database", str(database), capsys=capsys)
    assert code == 0, err
    assert out.startswith(f"# rockbot eval from-runs {ids[0]} {ids[1]}\n")
    document = yaml.safe_load(out)
    evaluation = Evaluation.model_validate(document)  # the resource rockbot eval run and kubectl apply take
    assert [case.expect.must_call for case in evaluation.spec.cases] == [["tool_0", "tool_1"], []]
    assert document["kind"] == "Evaluation" and document["metadata"] == {"name": "triage-from-runs",
                                                                         "namespace": "team-a"}
    assert document["spec"]["agentRef"] == {"name": "triage"}
    first, second = document["spec"]["cases"]
    assert first == {"name": "run-" + ids[0].rpartition("-")[2][:16], "input": "Which tickets are open?",
                     "expect": {"mustCall": ["tool_0", "tool_1"]}}
    assert second["input"] == "Say hello" and second["expect"] == {"maxToolCalls": 0}

    code, _, err = await _from_runs(ids[2], "--database", str(database), capsys=capsys)
    assert code == 1 and f"run {ids[2]} ended Failed: pick runs that went well" in err
    code, _, err = await _from_runs(ids[3], "--database", str(database), capsys=capsys)
    assert code == 1 and "was recorded with Metadata" in err
    code, _, err = await _from_runs(ids[0], ids[4], "--database", str(database), capsys=capsys)
    assert code == 1 and "the runs are of 2 Agents (team-a/other, team-a/triage)" in err
    code, _, err = await _from_runs("no-such-run", "--database", str(database), capsys=capsys)
    assert code == 1 and "no run 'no-such-run'" in err
