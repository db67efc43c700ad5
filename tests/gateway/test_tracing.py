"""A webhook's run is one trace: the request, the run (findable by its id), the agent's turn."""

from __future__ import annotations

from tests.fixtures.llm import Turn
from tests.fixtures.tracing import Spans
from tests.gateway.conftest import Cluster, StartGateway, send


async def test_a_webhooks_run_is_one_trace_from_the_request_to_the_agents_turn(
    cluster: Cluster, triage, scripted_llm, start_gateway: StartGateway, spans: Spans
) -> None:
    scripted_llm.play(Turn(text="Triaged."))
    await cluster.webhook_trigger()
    gateway = await start_gateway()
    await cluster.ready()
    answer = await send(gateway, delivery="d-traced")
    assert answer.status == 202, answer
    await cluster.history(["Succeeded"])
    run = spans.one("trigger run")
    assert run.attributes["rockbot.run.id"] == answer.body["runId"]
    (turn,) = await spans.ended("invoke_agent triage")
    assert turn.context.trace_id == run.context.trace_id
    assert spans.ancestors(turn) == ["process InboxRequest", "publish InboxRequest", "trigger run",
                                     "POST /hooks/{namespace}/{name}"]
    assert turn.attributes["rockbot.turn.source"] == "trigger"
    assert turn.attributes["rockbot.request.id"].endswith(answer.body["runId"])
