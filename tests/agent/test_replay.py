"""An agent replaying a recorded run in recorded mode runs no script: on the real broker, a script run in the
scripts-manager's local sandbox is recorded in the store, then the same turn replayed with the recorded calls
(`console.replay.replay_of`, as the console sends them) gets the recorded output without a sandbox call, and a call
with other arguments is answered as not run."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry

from rockbot.agent.recording import bus_publisher
from rockbot.agent.runtime import AgentRuntime
from rockbot.agent.sandbox import ScriptSandbox
from rockbot.bus import CONSOLE, SCRIPTS_MANAGER, AmqpBus, Principal
from rockbot.console.recording import RecorderMetrics, RunWriter
from rockbot.console.replay import ReplayOptions, replay_of
from rockbot.console.store import Store
from rockbot.console.store_models import RunDetail
from rockbot.contracts.inbox import NOT_REPLAYED
from rockbot.health import Readiness
from rockbot.scripts_manager.app import ScriptsManager
from rockbot.scripts_manager.settings import ScriptsManagerSettings
from tests.agent.configs import API_KEY_ENV, agent_config
from tests.fixtures.llm import ScriptedCall, ScriptedLLM, Turn
from tests.fixtures.rabbitmq import Vhost
from tests.waiting import eventually

AGENT = Principal.agent(namespace="team-a", name="helper-bot")


class CountedSandbox:
    """The real sandbox client, counting the scripts it is asked to run."""

    def __init__(self, sandbox: ScriptSandbox) -> None:
        self.sandbox = sandbox
        self.scripts = 0

    async def execute_python_script(self, **request: Any) -> Any:
        self.scripts += 1
        return await self.sandbox.execute_python_script(**request)


async def _ended(store: Store, run_id: str | None) -> RunDetail:
    assert run_id is not None

    async def ended() -> RunDetail:
        run = await store.get_run(run_id)
        assert run is not None and run.outcome is not None
        return run

    return await eventually(ended)


async def test_a_recorded_replay_answers_a_script_call_from_the_record_and_runs_nothing(
        vhost: Vhost, store: Store, scripted_llm: ScriptedLLM) -> None:
    script = ScriptedCall(name="execute_python_script", arguments={"script": "print(6 * 7)"})
    manager = ScriptsManager(settings=ScriptsManagerSettings(
        scripts_backend="local", health_host="127.0.0.1", health_port=0, amqp_url=await vhost.url(SCRIPTS_MANAGER)))
    console = await AmqpBus.connect(url=await vhost.url(CONSOLE))
    writer = RunWriter(store=store, bus=console, readiness=Readiness(), metrics=RecorderMetrics(CollectorRegistry()))
    await manager.start()
    await writer.start()
    try:
        async with await AmqpBus.connect(url=await vhost.url(AGENT)) as bus:
            config = agent_config(llm_url=scripted_llm.url, builtin_tools=["scripts"])
            sandbox = CountedSandbox(ScriptSandbox.for_agent(bus=bus, config=config))
            agent = AgentRuntime.from_config(config, bus=bus, env={API_KEY_ENV: "k"}, sandbox=sandbox,
                                             publish_runs=bus_publisher(bus))  # fmt: skip
            async with agent:
                scripted_llm.play(Turn(tool_calls=[script]), Turn(text="42"))
                first = await agent.chat("s1", "What is 6 x 7?", caller="http")
                original = await _ended(store, first.run_id)
                assert sandbox.scripts == 1

                content, replay = replay_of(original, ReplayOptions(mode="recorded"))
                scripted_llm.play(Turn(tool_calls=[script]), Turn(text="42 again"))
                again = await agent.chat("replay-1", content, caller="console:ann", replay=replay)
                same = await _ended(store, again.run_id)

                changed = ScriptedCall(name="execute_python_script", arguments={"script": "print(7 * 7)"})
                scripted_llm.play(Turn(tool_calls=[changed]), Turn(text="no answer"))
                other = await _ended(store, (await agent.chat("replay-2", content, caller="console:ann",
                                                              replay=replay)).run_id)
    finally:
        await writer.stop()
        await console.close()
        await manager.stop()
    assert sandbox.scripts == 1  # neither replay ran a script
    assert content == "What is 6 x 7?" and replay.of_run == original.run_id
    [recorded] = [e for e in original.timeline if e.kind == "tool_call"]
    [answered] = [e for e in same.timeline if e.kind == "tool_call"]
    assert answered.status == "ok" and answered.data["result"] == recorded.data["result"]
    assert "42" in answered.data["result"]
    assert [e for e in same.timeline if e.kind == "script_run"] == []
    assert (same.source, same.parent_run_id, same.outcome) == ("replay", original.run_id, "Succeeded")
    [refused] = [e for e in other.timeline if e.kind == "tool_call"]
    assert refused.status == "Rejected" and refused.data["result"].startswith(NOT_REPLAYED)
