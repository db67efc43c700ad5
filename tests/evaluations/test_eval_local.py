"""`rockbot eval run` with rockbot local: cases go through the agent's inbox, tools and sandbox, are checked, judged,
recorded as runs of source `evaluation`, kept for `rockbot eval show`, and fail a CI step under the pass ratio."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.llm import ScriptedCall, ScriptedLLM, Turn
from tests.local.test_local import EXAMPLES, model_env

SUM = "print(1 + 2 + 39)\n"


async def rockbot(*args: str, state: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {key: value for key, value in os.environ.items() if not key.startswith("OPENAI_")}
    return await asyncio.to_thread(
        subprocess.run, [sys.executable, "-m", "rockbot.cli", *args], capture_output=True, text=True, timeout=180,
        env={**clean, "XDG_STATE_HOME": str(state), "HOME": str(state), **env},
    )  # fmt: skip


def analyst(body: dict[str, Any]) -> Turn:
    """The analyst as a model would play it: compute with a script, then answer from the script's output; with a
    prompt that says to answer from memory, it does (the must-call tool disappears)."""
    messages = body["messages"]
    last = messages[-1]
    if last["role"] == "tool":
        return Turn(text=f"The result is {last['content'].strip()}.")
    if "450" in last["content"]:
        earlier = " ".join(m["content"] or "" for m in messages[:-1])
        return Turn(text="750 EUR are left." if "1200" in earlier else "I do not know your budget.")
    if "from memory" in messages[0]["content"]:
        return Turn(text="About 40, I guess.")
    return Turn(tool_calls=[ScriptedCall(name="execute_python_script", arguments={"script": SUM})])


def judge(score: float):
    def grade(body: dict[str, Any]) -> Turn:
        return Turn(text=json.dumps({"score": score, "reason": "graded"}))
    return grade


@pytest.fixture
async def judge_llm():
    server = await ScriptedLLM(model="judge-model").start()
    try:
        yield server
    finally:
        await server.stop()


def _folder(tmp_path: Path, *, prompt: str | None = None, approval: str | None = None) -> Path:
    folder = tmp_path / "files"
    folder.mkdir(parents=True)
    agents = (EXAMPLES / "analyst.yaml").read_text()
    if prompt is not None:
        agents = agents.replace("never guess numbers.", prompt)
    if approval is not None:
        agents = agents.replace("  scriptLimits: {timeoutSeconds: 30, cpu: 500m, memory: 256Mi}",
                                "  scriptLimits: {timeoutSeconds: 30, cpu: 500m, memory: 256Mi}\n"
                                "  approval: {tools: [execute_python_script], timeoutSeconds: 3600}")
    (folder / "analyst.yaml").write_text(agents)
    evaluation = (EXAMPLES / "analyst-evaluation.yaml").read_text()
    if approval is not None:
        evaluation = evaluation.replace("      input: What is 1 + 2 + 39? Compute it.\n",
                                        "      input: What is 1 + 2 + 39? Compute it.\n"
                                        f"      approvals: [{{tool: execute_python_script, decision: {approval}}}]\n")
    (folder / "analyst-evaluation.yaml").write_text(evaluation)
    return folder


def _env(llm: ScriptedLLM, judge_llm: ScriptedLLM) -> tuple[str, ...]:
    return ("--judge-base-url", judge_llm.url, "--judge-model", judge_llm.model)


async def test_the_example_evaluation_passes_through_the_agents_real_path(scripted_llm, judge_llm, tmp_path):
    scripted_llm.loop = True
    scripted_llm.play(analyst)
    judge_llm.loop = True
    judge_llm.play(judge(0.9))
    result = await rockbot("eval", "run", str(_folder(tmp_path)), *_env(scripted_llm, judge_llm), "--json",
                           state=tmp_path, env=model_env(scripted_llm))
    assert result.returncode == 0, result.stderr
    assert "✓ computes-a-sum #1" in result.stderr and "✓ follows-the-conversation #1 (judge 0.90)" in result.stderr
    assert "score 1.00 (2 of 2 case runs passed), passRatio 1: PASSED" in result.stderr
    status = json.loads(result.stdout)["status"]
    assert [(c["name"], c["result"]) for c in status["cases"]] == [
        ("computes-a-sum", "Passed"), ("follows-the-conversation", "Passed")]
    # the script really ran in the sandbox: its output is what the model read
    tool_results = [m["content"] for r in scripted_llm.requests for m in r.messages if m["role"] == "tool"]
    assert any("42" in content for content in tool_results)
    # the judge read the input, the answer and the criteria
    graded = judge_llm.requests[0].messages[-1]["content"]
    assert "How much is left after spending 450?" in graded and "750 EUR are left." in graded
    # each case run is a recorded run of its own, source evaluation
    runs = await rockbot("runs", "--database", str(tmp_path / ".local/state/rockbot/runs.db"), "--json", "list",
                         "--source", "evaluation", state=tmp_path, env={})
    assert runs.returncode == 0, runs.stderr
    recorded = json.loads(runs.stdout)["runs"]
    assert sorted(run["run_id"] for run in recorded) == sorted(r for c in status["cases"] for r in c["agentRuns"])

    shown = await rockbot("eval", "show", "analyst-basics", state=tmp_path, env={})
    assert shown.returncode == 0, shown.stderr
    assert "analyst-basics: score 1.00" in shown.stdout and "✓ computes-a-sum" in shown.stdout


async def test_a_prompt_that_drops_the_must_call_tool_fails_the_ci_step(scripted_llm, judge_llm, tmp_path):
    scripted_llm.loop = True
    scripted_llm.play(analyst)
    judge_llm.loop = True
    judge_llm.play(judge(0.9))
    folder = _folder(tmp_path, prompt="Answer from memory, at once.")
    result = await rockbot("eval", "run", str(folder), *_env(scripted_llm, judge_llm), state=tmp_path,
                           env=model_env(scripted_llm))
    assert result.returncode == 1, result.stderr
    assert ("✗ computes-a-sum #1: the answer does not contain '42'; execute_python_script was not called "
            "(called: none)") in result.stderr
    assert "score 0.50 (1 of 2 case runs passed), passRatio 1: FAILED" in result.stderr
    # the trend keeps both runs of the same Evaluation, oldest first
    fixed = await rockbot("eval", "run", str(_folder(tmp_path / "fixed")), *_env(scripted_llm, judge_llm),
                           state=tmp_path, env=model_env(scripted_llm))
    assert fixed.returncode == 0, fixed.stderr
    shown = await rockbot("eval", "show", "analyst-basics", "--json", state=tmp_path, env={})
    assert [run["score"] for run in json.loads(shown.stdout)["trend"]] == [0.5, 1.0]


async def test_a_judge_score_under_the_threshold_fails_the_case(scripted_llm, judge_llm, tmp_path):
    scripted_llm.loop = True
    scripted_llm.play(analyst)
    judge_llm.loop = True
    judge_llm.play(judge(0.4))
    result = await rockbot("eval", "run", str(_folder(tmp_path)), *_env(scripted_llm, judge_llm), state=tmp_path,
                           env=model_env(scripted_llm))
    assert result.returncode == 1, result.stderr
    assert ("✗ follows-the-conversation #1 (judge 0.40): the judge scored 0.40, under the rubric's threshold 0.7"
            in result.stderr)


@pytest.mark.parametrize("decision", ["Approve", "Deny"])
async def test_an_approval_gated_tool_is_answered_by_the_case_never_a_person(scripted_llm, judge_llm, tmp_path,
                                                                              decision):
    scripted_llm.loop = True
    scripted_llm.play(analyst)
    judge_llm.loop = True
    judge_llm.play(judge(0.9))
    result = await rockbot("eval", "run", str(_folder(tmp_path, approval=decision)), *_env(scripted_llm, judge_llm),
                           "--json", state=tmp_path, env=model_env(scripted_llm))
    tool_results = [m["content"] for r in scripted_llm.requests for m in r.messages if m["role"] == "tool"]
    status = json.loads(result.stdout)["status"]
    run_id = status["cases"][0]["agentRuns"][0]
    shown = await rockbot("runs", "--database", str(tmp_path / ".local/state/rockbot/runs.db"), "--json", "show",
                          run_id, state=tmp_path, env={})
    approvals = [e for e in json.loads(shown.stdout)["timeline"] if e["kind"] == "approval"]
    assert [(a["status"], a["data"]["decided_by"]) for a in approvals][-1] == (
        ("Approved" if decision == "Approve" else "Denied"), "evaluation")
    if decision == "Approve":
        assert result.returncode == 0, result.stderr
        assert any("42" in content for content in tool_results)
    else:
        assert result.returncode == 1, result.stderr
        error = json.loads(tool_results[0])["error"]
        assert error["code"] == "Rejected" and "the case denies it" in error["message"]
        assert "✗ computes-a-sum #1: the answer does not contain '42'" in result.stderr


async def test_over_rabbitmq_the_cases_cross_the_broker_as_service_local(scripted_llm, judge_llm, tmp_path, vhost):
    scripted_llm.loop = True
    scripted_llm.play(analyst)
    judge_llm.loop = True
    judge_llm.play(judge(0.9))
    result = await rockbot("eval", "run", str(_folder(tmp_path)), *_env(scripted_llm, judge_llm), "--amqp-url",
                           vhost.admin_url, "--management-url", vhost.broker.management_url, state=tmp_path,
                           env=model_env(scripted_llm))
    assert result.returncode == 0, result.stderr
    assert "score 1.00 (2 of 2 case runs passed), passRatio 1: PASSED" in result.stderr
    queues = await asyncio.to_thread(vhost.queues)
    assert queues["agent.local.analyst.inbox"][0] == 0, queues  # every case taken and answered
