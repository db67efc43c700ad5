"""`rockbot agent --config FILE` as a real process: config errors, then serving chat over HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys

import aiohttp
import yaml

from tests.agent.configs import API_KEY_ENV, agent_config
from tests.fixtures.llm import ScriptedCall, Turn

TOKEN_ENV = "TEST_AGENT_HTTP_TOKEN"
SECRET = "tok-9f8e7d6c"


def rockbot_agent(*args: str, env: dict[str, str] | None = None):
    command = [sys.executable, "-m", "rockbot.cli", "agent", *args]
    environment = {k: v for k, v in os.environ.items() if not k.startswith("ROCKBOT_")} | (env or {})
    return command, environment


def test_an_invalid_config_names_the_field(tmp_path):
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump({"name": "x", "namespace": "y", "model": {"name": "m"}}))
    command, env = rockbot_agent("--config", str(path))
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "model.base_url: Field required" in done.stderr and str(path) in done.stderr


def test_a_configured_token_env_that_is_empty_is_an_error(tmp_path):
    path = tmp_path / "agent.yaml"
    config = agent_config(llm_url="http://127.0.0.1:9/v1", http_token={"env": TOKEN_ENV})
    path.write_text(config.model_dump_json())
    command, env = rockbot_agent("--config", str(path))
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and f"env var {TOKEN_ENV}, which is empty" in done.stderr


async def bound_port(process) -> int:
    """The port the agent reports it bound (it was started with `--port 0`: no free-port guess to race)."""
    seen = []
    while line := (await process.stderr.readline()).decode():
        seen.append(line)
        if match := re.search(r"listening on 127\.0\.0\.1:(\d+)", line):
            return int(match.group(1))
    raise AssertionError(f"the agent exited without listening: {''.join(seen)}")


async def ready(http: aiohttp.ClientSession, base: str, process) -> None:
    """Until /readyz says 200 (the caller's wait_for fails the test at its deadline)."""
    while True:
        assert process.returncode is None, "the agent process exited before it was ready"
        try:
            async with http.get(f"{base}/readyz") as response:
                if response.status == 200:
                    return
        except aiohttp.ClientConnectionError:
            pass
        await asyncio.sleep(0.1)


@contextlib.asynccontextmanager
async def serving_agent(tmp_path, config, *, env: dict[str, str] | None = None):
    """`rockbot agent --bus memory --port 0` with this config: (the process, its base URL) once it is ready."""
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump(config.model_dump(mode="json")))
    command, env = rockbot_agent("--config", str(path), "--bus", "memory", "--host", "127.0.0.1", "--port", "0",
                                 "--log-format", "text", env={TOKEN_ENV: SECRET, API_KEY_ENV: "k", **(env or {})})
    process = await asyncio.create_subprocess_exec(*command, env=env, stderr=asyncio.subprocess.PIPE)
    try:
        base = f"http://127.0.0.1:{await asyncio.wait_for(bound_port(process), 30)}"
        async with aiohttp.ClientSession() as http:
            await asyncio.wait_for(ready(http, base, process), 30)
        yield process, base
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
        await asyncio.wait_for(process.wait(), 30)


async def test_the_agent_process_serves_chat_and_stops_on_sigterm(tmp_path, scripted_llm):
    scripted_llm.play(Turn(text="Hello from a process."))
    config = agent_config(llm_url=scripted_llm.url, http_token={"env": TOKEN_ENV}, builtin_tools=["memory"])
    async with serving_agent(tmp_path, config) as (process, base), aiohttp.ClientSession() as http:
        body = {"messages": [{"role": "user", "content": "hi"}]}
        async with http.post(f"{base}/v1/chat/completions", json=body) as response:
            assert response.status == 401
        async with http.post(f"{base}/v1/chat/completions", json=body,
                             headers={"Authorization": f"Bearer {SECRET}"}) as response:
            answer = await response.json()
    assert answer["choices"][0]["message"]["content"] == "Hello from a process."
    assert scripted_llm.requests[0].authorization == "Bearer k"
    assert scripted_llm.requests[0].tool_names == ["get_from_working_memory"]
    logs = (await process.stderr.read()).decode()
    assert process.returncode == 0, logs
    assert "ready with 1 tools" in logs and SECRET not in logs


async def test_with_the_in_memory_bus_a_script_is_refused_at_once_not_after_the_scripts_timeout(tmp_path, scripted_llm):
    scripted_llm.play(Turn(tool_calls=[ScriptedCall(name="execute_python_script", arguments={"script": "print(1)"})]),
                      Turn(text="No sandbox here."))
    config = agent_config(llm_url=scripted_llm.url, http_token={"env": TOKEN_ENV}, builtin_tools=["scripts"])
    async with serving_agent(tmp_path, config) as (_, base), aiohttp.ClientSession() as http:
        body = {"messages": [{"role": "user", "content": "run it"}]}
        async with asyncio.timeout(30), http.post(
            f"{base}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {SECRET}"}
        ) as response:
            answer = await response.json()
    assert answer["choices"][0]["message"]["content"] == "No sandbox here."
    refusal = json.loads(scripted_llm.requests[1].messages[-1]["content"])["error"]
    assert refusal["code"] == "Unavailable" and "no scripts-manager is in reach" in refusal["message"]


async def test_the_agent_process_exports_its_spans_to_the_otlp_endpoint_it_is_given(tmp_path, scripted_llm,
                                                                                    otlp_collector):
    scripted_llm.play(Turn(text="Traced."))
    config = agent_config(llm_url=scripted_llm.url, http_token={"env": TOKEN_ENV})
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": otlp_collector.url, "OTEL_RESOURCE_ATTRIBUTES": "team=a"}
    body = {"messages": [{"role": "user", "content": "hi"}]}
    auth = {"Authorization": f"Bearer {SECRET}"}
    async with serving_agent(tmp_path, config, env=env) as (process, base), aiohttp.ClientSession() as http, \
            http.post(f"{base}/v1/chat/completions", json=body, headers=auth) as answer:
        assert answer.status == 200
    assert process.returncode == 0  # and it sent what it held before it stopped
    spans = otlp_collector.spans()
    assert {"POST /v1/chat/completions", "invoke_agent helper-bot", "chat scripted-model"} <= set(spans)
    [resource] = otlp_collector.resources()
    assert (resource["service.name"], resource["team"]) == ("rockbot-agent", "a")
