"""`rockbot local` as a user runs it: a real process, the scripted LLM over HTTP, the real sandbox."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import os
import pathlib
import socket
import subprocess
import sys
import tempfile

import aiohttp

from rockbot.agent.registry import ToolContext
from rockbot.contracts.inbox import InboxReply
from rockbot.local import broker
from rockbot.local.app import running
from rockbot.local.assembly import LocalModel, assemble
from rockbot.local.manifests import load
from rockbot.resources import ScheduledTask
from rockbot.scripts_manager.settings import ScriptsManagerSettings
from tests.fixtures.llm import ScriptedCall, Turn
from tests.waiting import eventually

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"
SUM = "import json, sys\nprint(sum(json.load(sys.stdin)))\n"


async def rockbot_local(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {key: value for key, value in os.environ.items() if not key.startswith("OPENAI_")}
    with tempfile.TemporaryDirectory() as state:  # its log file goes here, not into the home folder
        return await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "rockbot.cli", "local", "--console-port", "0", *args],
            capture_output=True,
            text=True,
            timeout=120,
            env={**clean, "XDG_STATE_HOME": state, **(env or {})},
        )


def sum_in_the_sandbox(numbers: list[int], *, answer: str) -> list[Turn]:
    """The model asks for a script that sums `numbers`, then answers."""
    call = ScriptedCall(name="execute_python_script", arguments={"script": SUM, "input_data": numbers})
    return [Turn(tool_calls=[call]), Turn(text=answer)]


def model_env(llm) -> dict[str, str]:
    """What a user exports to point `rockbot local` at a model: here the scripted one."""
    return {"OPENAI_BASE_URL": llm.url, "OPENAI_API_KEY": "sk-local", "OPENAI_MODEL": llm.model}


async def test_the_examples_answer_a_prompt_with_a_script_run_in_the_sandbox(scripted_llm):
    scripted_llm.play(*sum_in_the_sandbox([1, 2, 39], answer="The sum is 42."))
    # The README's command: the whole folder (the in-cluster MCP example sits in a sub-folder it skips).
    result = await rockbot_local(
        "-f",
        str(EXAMPLES),
        "--prompt",
        "Add 1, 2 and 39.",
        env=model_env(scripted_llm),
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "The sum is 42.\n"
    assert "[tools called: execute_python_script]" in result.stderr
    # The sandbox's isolation canary tried a listener and a DNS responder on this host and reached neither.
    assert "[sandbox: EgressRestricted=True (NothingReached): local scripts reached none of host (tcp://127.0.0.1:" \
        in result.stderr
    tool_result = scripted_llm.requests[1].messages[-1]["content"]
    assert tool_result.startswith("exit code 0 after ") and "--- stdout ---\n42\n" in tool_result
    first = scripted_llm.requests[0]
    assert first.authorization == "Bearer sk-local"
    assert {"execute_python_script", "exchange-rates", "researcher", "schedule_task"} <= set(first.tool_names)
    assert "warning" not in result.stderr.lower()


async def test_without_the_agents_model_key_it_says_how_to_give_one():
    result = await rockbot_local("-f", str(EXAMPLES / "analyst.yaml"), "--prompt", "hi")
    assert result.returncode == 2
    assert result.stderr.startswith(
        f"rockbot local: {EXAMPLES / 'analyst.yaml'}: Agent 'analyst': spec.model.apiKeySecretRef: the key for "
        "https://openrouter.ai/api/v1 is in Secret 'llm' (key 'apiKey'), which is not in these files: add it as a "
        "kind: Secret document, export OPENAI_API_KEY, or point every agent at another endpoint with OPENAI_BASE_URL"
    )
    assert "Traceback" not in result.stderr


async def test_agents_that_name_their_own_endpoint_need_no_openai_base_url(scripted_llm, tmp_path):
    scripted_llm.api_key = "sk-from-the-secret"
    scripted_llm.play(Turn(text="Basalt."))
    agent = (EXAMPLES / "analyst.yaml").read_text().split("---")[0]
    agent = agent.replace("https://openrouter.ai/api/v1", scripted_llm.url).replace(
        "openai/gpt-4o-mini", scripted_llm.model)
    secret = ("apiVersion: v1\nkind: Secret\nmetadata: {name: llm}\n"
              "stringData: {apiKey: sk-from-the-secret}\n")
    write(tmp_path, "agent.yaml", agent + "---\n" + secret)
    result = await rockbot_local("-f", str(tmp_path / "agent.yaml"), "--prompt", "a rock?")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "Basalt.\n" and f"at {scripted_llm.url}" in result.stderr
    assert scripted_llm.requests[0].authorization == "Bearer sk-from-the-secret"


async def test_an_invalid_manifest_is_named_with_its_field(tmp_path):
    (tmp_path / "bad.yaml").write_text(
        "apiVersion: rockbot.dev/v1alpha1\nkind: Tool\nmetadata: {name: broken}\n"
        "spec: {description: x, script: {source: 'print(1)'}, rest: {url: 'https://x.example'}}\n"
    )
    result = await rockbot_local(
        "-f", str(tmp_path), "--prompt", "hi", env={"OPENAI_BASE_URL": "http://127.0.0.1:9/v1"}
    )
    assert result.returncode == 2
    assert result.stderr == (
        f"rockbot local: {tmp_path / 'bad.yaml'}: Tool 'broken' is invalid: spec: "
        "a Tool has exactly one backend: set one of rest, mcp, script, agent or a2a\n"
    )


async def test_an_unreachable_model_is_one_line_not_a_traceback():
    result = await rockbot_local(
        "-f", str(EXAMPLES / "analyst.yaml"), "--prompt", "hi", env={"OPENAI_BASE_URL": "http://127.0.0.1:9/v1"}
    )
    assert result.returncode == 1
    assert "error: cannot reach the model endpoint http://127.0.0.1:9/v1/chat/completions" in result.stderr
    assert "Traceback" not in result.stderr


class Reports:
    """What the local scheduler (or the webhook Triggers) reported, as it arrives."""

    def __init__(self) -> None:
        self.items: list[tuple[str, InboxReply | None, str | None]] = []
        self.arrived = asyncio.Event()

    def __call__(self, *report) -> None:
        self.items.append(report)
        self.arrived.set()


@contextlib.asynccontextmanager
async def running_in_process(folder: pathlib.Path, llm):
    """Every part of a local run for the manifests in `folder`, in this process, on the in-memory bus."""
    manifests = load([folder])
    agents = assemble(manifests, model=LocalModel(base_url=llm.url, name=llm.model, api_key_env=None))
    tasks = [ScheduledTask.model_validate(body) for body in manifests.tasks.values()]
    scripts = ScriptsManagerSettings(scripts_backend="local", health_host="127.0.0.1", health_port=0)
    connect = await broker.in_memory([assembled.config for assembled in agents.values()])
    reports = Reports()
    async with running(connect=connect, agents=agents, tasks=tasks, report=reports, scripts=scripts,
                       triggers=list(manifests.triggers.values()), keys=manifests.secrets, trigger_report=reports,
                       webhook_port=0) as local:  # fmt: skip
        yield local, reports


async def test_a_scheduled_task_fires_through_the_agent_inbox(scripted_llm, tmp_path):
    (tmp_path / "task.yaml").write_text(
        (EXAMPLES / "analyst.yaml")
        .read_text()
        .replace('schedule: "0 8 * * *"', 'schedule: "* * * * * *"')
        .replace("concurrencyPolicy: Forbid", "runOnce: true")
    )
    scripted_llm.play(Turn(text="Rates look calm."))
    async with running_in_process(tmp_path, scripted_llm) as (_, reports), asyncio.timeout(10):
        await reports.arrived.wait()
    ((task, reply, problem),) = reports.items
    assert (task, problem) == ("morning-rates", None)
    assert reply is not None and reply.answer == "Rates look calm."
    assert scripted_llm.requests[0].messages[-1]["content"].startswith("Compare today's EUR rates")


async def test_over_rabbitmq_a_prompt_runs_a_script_and_shows_progress_while_the_tool_runs(scripted_llm, vhost):
    scripted_llm.play(*sum_in_the_sandbox([4, 5, 6], answer="The sum is 15."))
    result = await rockbot_local(
        "-f",
        str(EXAMPLES),
        "--amqp-url",
        vhost.admin_url,
        "--management-url",
        vhost.broker.management_url,
        "--prompt",
        "Add 4, 5 and 6.",
        env=model_env(scripted_llm),
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "The sum is 15.\n"
    tool_result = scripted_llm.requests[1].messages[-1]["content"]
    assert tool_result.startswith("exit code 0 after ") and "--- stdout ---\n15\n" in tool_result
    lines = result.stderr.splitlines()
    started = lines.index("  … running execute_python_script")
    finished = next(i for i, line in enumerate(lines) if line.startswith("  ✓ execute_python_script ("))
    assert started < finished < lines.index("[tools called: execute_python_script]")
    assert lines[finished].endswith(" s) ok")
    # The request and its answer crossed the broker: its queues exist in the test's vhost, drained (the broker's
    # counts follow the manager's ack, sent after its answer, a moment later).
    async def drained() -> dict[str, tuple[int, int]]:
        queues = await asyncio.to_thread(vhost.queues)
        assert queues["script.invoke"] == (0, 0), queues
        return queues

    queues = await eventually(drained, within=30)
    assert "agent.local.analyst.replies.0" in queues, queues  # the reply slot the analyst claimed
    # Each part logged in as itself: a user per agent, the scripts-manager and the local scheduler.
    users = await vhost.admin.users(tag="rockbot-agent") | await vhost.admin.users(tag="rockbot-service")
    assert {"agent.local.analyst", "service.scripts-manager", "service.local"} <= users


def write(folder: pathlib.Path, name: str, text: str) -> pathlib.Path:
    path = folder / name
    path.write_text(text)
    return path


TASK = """apiVersion: rockbot.dev/v1alpha1
kind: ScheduledTask
metadata: {{name: nightly}}
spec: {{agentRef: {{name: {agent}}}, schedule: "{schedule}", timeZone: {zone}, prompt: Report.}}
"""
NOWHERE = {"OPENAI_BASE_URL": "http://127.0.0.1:9/v1"}


async def test_a_bad_schedule_or_time_zone_is_one_line_naming_the_file_the_task_and_the_field(tmp_path):
    analyst = str(EXAMPLES / "analyst.yaml")
    bad_cron = write(tmp_path, "cron.yaml", TASK.format(agent="analyst", schedule="61 * * * *", zone="UTC"))
    result = await rockbot_local("-f", analyst, "-f", str(bad_cron), "--prompt", "hi", env=NOWHERE)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(f"rockbot local: {bad_cron}: ScheduledTask 'nightly' is invalid: spec.schedule: ")
    assert "Traceback" not in result.stderr and len(result.stderr.splitlines()) == 1

    bad_zone = write(tmp_path, "zone.yaml", TASK.format(agent="analyst", schedule="0 8 * * *", zone="Mars/Olympus"))
    result = await rockbot_local("-f", analyst, "-f", str(bad_zone), "--prompt", "hi", env=NOWHERE)
    assert result.returncode == 2
    assert result.stderr.startswith(f"rockbot local: {bad_zone}: ScheduledTask 'nightly' is invalid: spec.timeZone: ")
    assert "Mars/Olympus" in result.stderr and "Traceback" not in result.stderr


async def test_a_task_for_an_agent_that_is_not_there_is_reported_at_start_and_never_fired(tmp_path):
    orphan = write(tmp_path, "orphan.yaml", TASK.format(agent="ghost", schedule="* * * * * *", zone="UTC"))
    manifests = load([EXAMPLES / "analyst.yaml", orphan])
    assert "nightly" not in manifests.tasks
    assert manifests.warnings == [
        f"{orphan}: ScheduledTask 'nightly': spec.agentRef.name: no Agent 'ghost' in these files (there are: "
        "analyst, researcher), so it will not fire: add the Agent or fix agentRef"
    ]


async def test_a_rule_of_the_crd_is_applied_locally_with_its_message(tmp_path):
    ftp = write(tmp_path, "ftp.yaml", "apiVersion: rockbot.dev/v1alpha1\nkind: Tool\nmetadata: {name: rates}\n"
                "spec: {description: x, rest: {url: 'ftp://files.example/rates'}}\n")
    result = await rockbot_local("-f", str(ftp), "--prompt", "hi", env=NOWHERE)
    assert result.returncode == 2
    assert result.stderr == (
        f"rockbot local: {ftp}: Tool 'rates' is invalid: spec.rest: url must start with http:// or https://\n"
    )


async def test_the_banner_lists_what_the_model_is_offered_and_a_failed_tool_is_marked_failed(scripted_llm, tmp_path):
    folder = tmp_path / "manifests"
    folder.mkdir()
    write(folder, "analyst.yaml", (EXAMPLES / "analyst.yaml").read_text().replace(
        "builtinTools: [scripts, memory, scheduling]",
        "builtinTools: [scripts, memory]\n  toolBlacklist: [get_from_working_memory]"))
    scripted_llm.play(Turn(tool_calls=[ScriptedCall(name="execute_python_script", arguments={"script": ""})]),
                      Turn(text="That failed."))
    result = await rockbot_local("-f", str(folder), "--prompt", "run nothing", env=model_env(scripted_llm))
    assert result.returncode == 0, result.stderr
    banner = next(line for line in result.stderr.splitlines() if line.startswith("[analyst: "))
    assert banner.endswith("tools: exchange-rates, researcher, execute_python_script, save_result_as_file]")
    failed = next(line for line in result.stderr.splitlines() if "execute_python_script (" in line)
    assert failed.startswith("  ✗ execute_python_script (") and "InvalidArguments" in failed
    assert "warning" not in result.stderr.lower()



async def test_log_lines_go_to_the_log_file_and_the_banner_says_when_there_were_warnings(scripted_llm, tmp_path):
    with socket.socket() as bound:  # bound, never listening: the MCP server is down
        bound.bind(("127.0.0.1", 0))
        write(tmp_path, "agent.yaml", f"""apiVersion: rockbot.dev/v1alpha1
kind: Agent
metadata: {{name: solo}}
spec:
  model: {{baseUrl: "https://llm.example/v1", name: m}}
  tools: [forecast]
---
apiVersion: rockbot.dev/v1alpha1
kind: Tool
metadata: {{name: forecast}}
spec:
  description: Forecast.
  mcp: {{server: weather, url: "http://127.0.0.1:{bound.getsockname()[1]}/mcp", tool: forecast}}
""")
        scripted_llm.play(Turn(text="Sunny."))
        state = tmp_path / "state"
        result = await rockbot_local("-f", str(tmp_path / "agent.yaml"), "--prompt", "weather?",
                                     env={**model_env(scripted_llm), "XDG_STATE_HOME": str(state)})
    assert result.returncode == 0, result.stderr
    log = state / "rockbot" / "local.log"
    assert f"[1 warning(s) while starting: see {log}]" in result.stderr.splitlines()
    assert ("[solo: MCP server 'weather' failed to start, so its tools answer Unavailable until it is back (the "
            "log says why)]") in result.stderr.splitlines()
    assert "WARNING" not in result.stderr and "unavailable" not in result.stderr
    assert "MCP server 'weather'" in log.read_text() and "ConnectError" in log.read_text()
    assert "TaskGroup" not in log.read_text()


def test_an_mcp_tools_secret_header_comes_from_a_secret_manifest_and_only_its_server_gets_it(tmp_path):
    write(tmp_path, "mcp.yaml", """apiVersion: v1
kind: Secret
metadata: {name: search-token}
stringData: {token: s3cret}
---
apiVersion: rockbot.dev/v1alpha1
kind: Agent
metadata: {name: solo}
spec:
  model: {baseUrl: "https://llm.example/v1", name: m}
  tools: [search, other]
---
apiVersion: rockbot.dev/v1alpha1
kind: Tool
metadata: {name: search}
spec:
  description: Search.
  mcp:
    server: search
    url: http://127.0.0.1:9/mcp
    tool: search
    headersFrom: [{name: Authorization, prefix: "Bearer ", secretKeyRef: {name: search-token, key: token}}]
---
apiVersion: rockbot.dev/v1alpha1
kind: Tool
metadata: {name: other}
spec: {description: Other., mcp: {server: other, url: "http://127.0.0.1:9/other", tool: other}}
""")
    [assembled] = assemble(load([tmp_path]), model=LocalModel(base_url="http://127.0.0.1:9/v1", name=None,
                                                              api_key_env=None)).values()
    search, other = (tool.backend for tool in assembled.config.tools)
    header = search.headers["Authorization"]
    assert header.prefix == "Bearer " and assembled.env[header.env] == "s3cret"
    assert other.headers == {} and "s3cret" not in assembled.config.model_dump_json()


async def test_the_readme_command_prints_no_warning_and_keeps_logs_out_of_the_chat(scripted_llm, tmp_path):
    scripted_llm.play(Turn(text="Hello."))
    result = await rockbot_local("-f", str(EXAMPLES), "--prompt", "hi",
                                 env={**model_env(scripted_llm), "XDG_STATE_HOME": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    assert "warning" not in result.stderr.lower()
    assert all(line.startswith(("[", "  ")) for line in result.stderr.splitlines()), result.stderr


async def test_an_agent_schedules_lists_and_cancels_its_own_tasks_and_they_fire(scripted_llm, tmp_path):
    """The scheduling tools answered by the local scheduler, by the operator's rules."""
    write(tmp_path, "agents.yaml", (EXAMPLES / "analyst.yaml").read_text())
    steps = [
        Turn(tool_calls=[ScriptedCall(name="schedule_task", arguments={
            "name": "ping", "cron": "* * * * * *", "prompt": "Ping!", "run_once": True})]),
        Turn(tool_calls=[ScriptedCall(name="cancel_scheduled_task", arguments={"name": "morning-rates"})]),
        Turn(text="Scheduled."),
    ]

    def respond(body):  # the scheduled prompt may come in between the chat's rounds
        if body["messages"][-1] == {"role": "user", "content": "Ping!"}:
            return Turn(text="Pong.")
        return steps[sum(message["role"] == "tool" for message in body["messages"])]

    scripted_llm.play(*[respond] * 4)
    async with running_in_process(tmp_path, scripted_llm) as (local, reports):
        analyst = local.agents["analyst"]
        result = await analyst.chat("s", "Remind me with a ping.", caller="service.test")
        async with asyncio.timeout(10):
            await reports.arrived.wait()
        listing = await analyst.registry.invoke("list_scheduled_tasks", {}, context=ToolContext(session_id="s"))
    assert result.answer == "Scheduled." and result.tools_called == ["schedule_task", "cancel_scheduled_task"]
    last_round = next(r for r in scripted_llm.requests if sum(m["role"] == "tool" for m in r.messages) == 2)
    scheduled, refused = (m["content"] for m in last_round.messages if m["role"] == "tool")
    assert scheduled.startswith("Scheduled task 'ping' (* * * * * * in UTC); next run: ")
    assert json.loads(refused)["error"]["code"] == "Rejected" and "not created by you" in refused
    [(task, reply, problem)] = reports.items
    assert (task, problem) == ("analyst.ping", None) and reply.answer == "Pong."
    assert "| ping | `* * * * * *` (once) | UTC | done (ran once) |" in listing.content
    assert "| morning-rates | `0 8 * * *` | Europe/Berlin |" in listing.content
    assert "no (set by a person)" in listing.content


async def test_the_triage_example_serves_its_github_webhook_on_a_local_port(scripted_llm, tmp_path):
    for example in (EXAMPLES / "github-triage").iterdir():
        write(tmp_path, example.name, example.read_text())
    scripted_llm.play(Turn(text="Labels: bug, browser:safari. Priority: P2. Which Safari version?"))
    issue = {"action": "opened", "issue": {"number": 7, "title": "Login fails on Safari", "body": "",
             "html_url": "https://github.com/acme/shop/issues/7"}, "repository": {"full_name": "acme/shop"},
             "sender": {"login": "octocat"}}  # fmt: skip

    async def deliver(payload: dict, delivery: str) -> int:
        body = json.dumps(payload).encode()
        signature = "sha256=" + hmac.new(b"local-development-only", body, hashlib.sha256).hexdigest()
        headers = {"Content-Type": "application/json", "X-GitHub-Event": "issues", "X-GitHub-Delivery": delivery,
                   "X-Hub-Signature-256": signature}  # fmt: skip
        url = f"http://127.0.0.1:{local.webhook_port}/hooks/local/github-issues"
        async with aiohttp.ClientSession() as session, session.post(url, data=body, headers=headers) as response:
            return response.status

    async with running_in_process(tmp_path, scripted_llm) as (local, reports):
        statuses = [await deliver(issue, "d-1"), await deliver(issue, "d-1"),
                    await deliver({**issue, "action": "closed"}, "d-2")]  # fmt: skip
        async with asyncio.timeout(10):
            await reports.arrived.wait()
    assert statuses == [202, 409, 200]
    assert reports.items == [("github-issues", "Labels: bug, browser:safari. Priority: P2. Which Safari version?",
                              None)]  # fmt: skip
    (request,) = scripted_llm.requests
    assert request.messages[-1]["content"].startswith(
        "Issue #7 was opened in acme/shop by octocat:\nhttps://github.com/acme/shop/issues/7\n\nTitle: Login fails")
    assert request.messages[-1]["content"].endswith("(no description)\n")
