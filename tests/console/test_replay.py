"""Replay of a recorded run (`rockbot replay`, `POST /api/runs/{id}/replay`): the console sends the run's input to
the agent's own process again over a real RabbitMQ, the scripted model answers, the run store (SQLite) keeps both
runs, and the comparison shows exactly what changed. In recorded mode no tool runs (the REST tool's server counts
its calls): a call matching a recorded one gets the recorded result, another is reported as not run. Only the console
may ask an agent for a replay."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from rockbot.cli import main
from rockbot.console.api import add_run_routes
from rockbot.console.auth_sessions import Sessions
from rockbot.console.authentication import Identity, Unauthenticated
from rockbot.console.authorization import CHAT, VIEW, Action
from rockbot.console.replay import Replayer
from rockbot.console.web.gate import Gate
from rockbot.contracts.agent_config import FunctionDefinition, ResolvedTool, RestBackend, ToolDefinition
from rockbot.contracts.errors import ErrorCode
from rockbot.contracts.inbox import InboxRequest, RecordedCall, Replay
from tests.agent.configs import agent_config
from tests.console.chat_world import ChatWorld, chat_world
from tests.console.test_chat import _sent_by_another_service
from tests.fixtures.llm import ScriptedCall, ScriptedLLM, Turn
from tests.fixtures.rabbitmq import Vhost
from tests.fixtures.serving import serving
from tests.waiting import bounded, eventually

TOKEN = "ann-token"


class Weather:
    """The REST tool's server: answers a city's weather and counts every call (a tool that ran)."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.url = ""

    async def handle(self, request: web.Request) -> web.Response:
        self.calls.append(request.match_info["city"])
        return web.json_response({"city": request.match_info["city"], "sky": "live sky"})


@pytest.fixture
async def weather() -> AsyncIterator[Weather]:
    server = Weather()
    app = web.Application()
    app.router.add_get("/weather/{city}", server.handle)
    async with serving(app) as server.url:
        yield server


class Rights:
    """The console's authorizer as RBAC would answer: the user may do `actions` in namespace team-a."""

    def __init__(self, *actions: Action) -> None:
        self.actions = set(actions)

    async def allowed(self, *, identity: Identity, namespace: str, action: Action) -> bool:
        return namespace == "team-a" and (action == VIEW or action in self.actions)


class Tokens:
    """The token reviewer as the API server answers it: ann's token is ann's."""

    async def identity(self, token: str) -> Identity:
        if token != TOKEN:
            raise Unauthenticated("not a token of this cluster")
        return Identity(username="ann")


async def _console_api(world: ChatWorld, rights: Rights) -> tuple[web.AppRunner, str]:
    app = web.Application(middlewares=[Gate(tokens=Tokens(), sessions=Sessions()).middleware()])  # type: ignore[arg-type]
    add_run_routes(app, store=world.store, authorizer=rights, replayer=Replayer(relay=world.relay, store=world.store))
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, host="127.0.0.1", port=0)
    await site.start()
    return runner, f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]


def _config(scripted_llm: ScriptedLLM, weather: Weather):
    tool = ResolvedTool(
        definition=ToolDefinition(function=FunctionDefinition(
            name="city_weather", description="The weather of a city",
            parameters={"type": "object", "properties": {"city": {"type": "string"}}})),
        source="tool:city_weather", backend=RestBackend(url=weather.url + "/weather/{city}"))  # fmt: skip
    return agent_config(llm_url=scripted_llm.url, name="helper", tools=[tool])


async def _recorded(world: ChatWorld, run_id: str | None) -> None:
    """Once the run's end is in the store (the agent records in the background)."""
    assert run_id is not None

    async def ended() -> None:
        run = await world.store.get_run(run_id)
        assert run is not None and run.outcome is not None

    await eventually(ended, within=30)


async def _cli(*args: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = await asyncio.to_thread(main, ["replay", "--token", TOKEN, *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


async def test_a_run_replays_recorded_and_live_and_the_diff_shows_the_changed_tool_call(
        scripted_llm: ScriptedLLM, vhost: Vhost, weather: Weather, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    async with chat_world(_config(scripted_llm, weather), vhost=vhost, folder=tmp_path) as world:
        # the original run: alice asks, the tool really runs for Paris
        scripted_llm.play(Turn(tool_calls=[ScriptedCall(name="city_weather", arguments={"city": "Paris"})]),
                          Turn(text="Sunny in Paris."))
        steps = [s async for s in world.relay.turn(namespace="team-a", agent="helper", user="alice",
                                                    session_id="s1", content="Weather in Paris?")]
        original = steps[-1].run_id  # type: ignore[union-attr]
        assert original and weather.calls == ["Paris"]
        await _recorded(world, original)
        runner, api = await _console_api(world, Rights(CHAT))
        try:
            # recorded, the model doing the same: the recorded result answers the call, nothing runs
            scripted_llm.play(Turn(tool_calls=[ScriptedCall(name="city_weather", arguments={"city": "Paris"})]),
                              Turn(text="Sunny in Paris."))
            code, out, err = await bounded(_cli(original, "--url", api, capsys=capsys), within=90, what="replay")
            assert code == 0, err
            assert "differs:  nothing" in out and weather.calls == ["Paris"]
            tool_answer = scripted_llm.requests[-1].messages[-1]
            assert tool_answer["role"] == "tool" and json.loads(tool_answer["content"])["sky"] == "live sky"

            # recorded, the model now asking for Lyon: reported as not run, and exactly that call differs
            scripted_llm.play(Turn(tool_calls=[ScriptedCall(name="city_weather", arguments={"city": "Lyon"})]),
                              Turn(text="No idea about Lyon."))
            code, out, err = await bounded(_cli(original, "--url", api, capsys=capsys), within=90, what="replay")
            assert code == 3, err
            assert weather.calls == ["Paris"]  # no tool ran
            rows = {line.split()[0] + (" " + line.split()[1] if line.startswith("tool") else ""): line
                    for line in out.splitlines()}
            assert 'city_weather({"city": "Paris"})' in rows["tool 1"]
            assert 'city_weather({"city": "Lyon"}) NOT RUN' in rows["tool 1"]
            assert " | " in rows["tool 1"] and " | " in rows["answer"] and " | " not in rows["model"]
            assert "differs:  answer, tool call 1" in out.splitlines()

            # live, with another model and prompt: the tool really runs for Lyon
            prompt = tmp_path / "prompt.md"
            prompt.write_text("You forecast the weather, briefly.")
            scripted_llm.play(Turn(tool_calls=[ScriptedCall(name="city_weather", arguments={"city": "Lyon"})]),
                              Turn(text="Live sky over Lyon."))
            scripted_llm.model = "other-model"  # the endpoint serves the model the replay names
            code, out, err = await bounded(_cli(original, "--url", api, "--mode", "live", "--model", "other-model",
                                                "--prompt-file", str(prompt), "--json", capsys=capsys),
                                           within=90, what="replay")  # fmt: skip
            assert code == 3, err
            comparison = json.loads(out)
            assert weather.calls == ["Paris", "Lyon"]
            assert scripted_llm.requests[-1].body["model"] == "other-model"
            assert scripted_llm.requests[-1].messages[0] == {"role": "system",
                                                             "content": "You forecast the weather, briefly."}
            replayed = comparison["replay"]
            assert [(c["name"], json.loads(c["arguments"]), c["status"]) for c in replayed["tool_calls"]] == [
                ("city_weather", {"city": "Lyon"}, "ok")]
            assert replayed["answer"] == "Live sky over Lyon." and replayed["model"] == "other-model"
            assert replayed["prompt_tokens"] > 0 and replayed["latency_seconds"] is not None

            # the replay is a run of its own: source replay, its parent the original, the replaying person's
            run = await world.store.get_run(replayed["run_id"])
            assert run is not None and run.source == "replay" and run.parent_run_id == original
            assert run.caller == "console:ann"
        finally:
            await runner.cleanup()


async def test_replaying_needs_the_right_to_chat_and_only_the_console_may_send_a_replay(
        scripted_llm: ScriptedLLM, vhost: Vhost, weather: Weather, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    async with chat_world(_config(scripted_llm, weather), vhost=vhost, folder=tmp_path) as world:
        scripted_llm.play(Turn(text="Hello."))
        steps = [s async for s in world.relay.turn(namespace="team-a", agent="helper", user="alice",
                                                    session_id="s1", content="Hi")]
        original = steps[-1].run_id  # type: ignore[union-attr]
        await _recorded(world, original)
        runner, api = await _console_api(world, Rights())  # may read, may not chat
        try:
            code, _, err = await _cli(original, "--url", api, capsys=capsys)
            assert code == 1 and "403" in err and "ann may not create agents/chat in namespace team-a" in err
            async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {TOKEN}"}) as http:
                async with http.post(f"{api}/api/runs/{original}/replay", json={"mode": "sideways"}) as response:
                    assert response.status == 403  # the right is asked before the body is read
                async with http.post(f"{api}/api/runs/not-a-run/replay", json={}) as response:
                    assert response.status == 404
        finally:
            await runner.cleanup()
        # a forged replay (tool results only the console may give) is refused before the model is asked
        forged = Replay(of_run=original, recorded=[RecordedCall(name="city_weather", arguments='{"city": "Paris"}',
                                                                result='{"sky": "forged"}')])
        refused = await _sent_by_another_service(vhost, InboxRequest(
            kind="user_message", request_id="forged", session_id="s9", content="Weather in Paris?", replay=forged))
        assert refused.error is not None and refused.error.code == ErrorCode.REJECTED
        assert "only the console replays a recorded run" in refused.error.message
    assert len(scripted_llm.requests) == 1
