"""execute_python_script end to end: agent loop -> ScriptSandbox client -> bus -> scripts-manager (local backend)."""

from __future__ import annotations

import pytest

from rockbot.agent.runtime import AgentRuntime
from rockbot.agent.sandbox import ScriptSandbox
from rockbot.bus import SCRIPTS_MANAGER, MemoryBroker, Principal
from rockbot.scripts_manager.app import ScriptsManager
from rockbot.scripts_manager.settings import ScriptsManagerSettings
from tests.agent.configs import API_KEY_ENV, agent_config
from tests.buses import login
from tests.fixtures.llm import ScriptedCall, Turn

SCRIPT = "import json, sys\ndata = json.load(sys.stdin)\nprint(data['a'] * data['b'])\n"


@pytest.fixture
async def broker_with_scripts_manager():
    broker = MemoryBroker()
    async with await login(broker, SCRIPTS_MANAGER) as bus:
        manager = ScriptsManager(
            settings=ScriptsManagerSettings(scripts_backend="local", health_host="127.0.0.1", health_port=0), bus=bus
        )
        await manager.start()
        try:
            yield broker
        finally:
            await manager.stop()


async def test_the_model_runs_a_script_in_the_sandbox(scripted_llm, broker_with_scripts_manager):
    bus = await login(broker_with_scripts_manager, Principal.agent(namespace="team-a", name="calc"))
    scripted_llm.play(
        Turn(tool_calls=[ScriptedCall(name="execute_python_script", arguments={
            "script": SCRIPT, "input_data": {"a": 6, "b": 7}})]),
        Turn(tool_calls=[ScriptedCall(name="execute_python_script", arguments={"script": "raise SystemExit(3)"})]),
        Turn(text="6 x 7 = 42"),
    )
    config = agent_config(llm_url=scripted_llm.url, name="calc", builtin_tools=["scripts"])
    sandbox = ScriptSandbox(bus=bus, namespace=config.namespace, agent=config.name)
    async with AgentRuntime.from_config(config, bus=bus, sandbox=sandbox, env={API_KEY_ENV: "k"}) as agent:
        result = await agent.chat("s", "What is 6 x 7? Use Python.", caller="service.test")
    assert result.answer == "6 x 7 = 42"
    ran = scripted_llm.requests[1].messages[-1]["content"]
    assert ran.startswith("exit code 0 after ") and "--- stdout ---\n42\n" in ran
    failed = scripted_llm.requests[2].messages[-1]["content"]
    assert failed.startswith("exit code 3 after ")


async def test_the_model_learns_what_the_script_left_under_output(scripted_llm, broker_with_scripts_manager):
    bus = await login(broker_with_scripts_manager, Principal.agent(namespace="team-a", name="calc"))
    script = (
        "import os\nout = os.environ['ROCKBOT_OUTPUT_DIR']\n"
        "open(f'{out}/clean.csv', 'w').write('month,revenue\\n2026-01,10\\n')\n"
        "os.symlink('/etc/passwd', f'{out}/passwd')\n"
    )
    scripted_llm.play(
        Turn(tool_calls=[ScriptedCall(name="execute_python_script", arguments={"script": script})]),
        Turn(text="Cleaned."),
    )
    config = agent_config(llm_url=scripted_llm.url, name="calc", builtin_tools=["scripts"])
    sandbox = ScriptSandbox(bus=bus, namespace=config.namespace, agent=config.name)
    async with AgentRuntime.from_config(config, bus=bus, sandbox=sandbox, env={API_KEY_ENV: "k"}) as agent:
        await agent.chat("s", "Clean it.", caller="service.test")
    told = scripted_llm.requests[1].messages[-1]["content"]
    assert (
        "--- files written to /output (shown to the user) ---\n"
        "- clean.csv (text/csv, 25 bytes)\n    month,revenue\n    2026-01,10\n"
        "- left out: passwd: a symbolic link (only files written under /output come back)\n"
        "- left out: the files were shown to the model but not kept for people: this agent has no run store"
    ) in told, told
    assert "bW9udGg" not in told  # never the content itself (base64 of "month")
