"""Issue 31 §2 on the real broker and the memory bus: run ids no other agent can predict or claim. An agent that
learned a helper's run id (from the helper's answer to it) claims it and the next 3,000 ids a per-process counter
would give; the helper's runs, that one and the next (another caller's), stay the helper's, whole."""

from __future__ import annotations

import datetime
import secrets
from pathlib import Path

from prometheus_client import CollectorRegistry

from rockbot.agent.recording import RunRecorder, bus_publisher
from rockbot.bus import CONSOLE, Principal
from rockbot.bus.topology import CONSOLE_RUNS
from rockbot.console.recording import RecorderMetrics, RunWriter
from rockbot.console.store import Store
from rockbot.console.store_models import RunFilter
from rockbot.contracts.recording import RunEvents, RunStarted
from rockbot.health import Readiness
from tests.console.conftest import Login
from tests.console.events import event_id
from tests.waiting import eventually

HELPER = Principal.agent(namespace="team-a", name="helper")
SQUATTER = Principal.agent(namespace="team-a", name="squatter")


async def test_no_agent_can_claim_another_agents_runs_even_by_an_id_it_learned(bus_login: Login,
                                                                               tmp_path: Path) -> None:
    store = await Store.open(url=f"sqlite:///{tmp_path / 'runs.db'}")
    metrics = RecorderMetrics(CollectorRegistry())
    writer = RunWriter(store=store, bus=await bus_login(CONSOLE), readiness=Readiness(), metrics=metrics)
    await writer.start()
    helper, squatter = await bus_login(HELPER), await bus_login(SQUATTER)
    recorder = RunRecorder(publish=bus_publisher(helper), namespace=HELPER.namespace, agent=HELPER.name)
    await recorder.start()

    async def helpers_run(session: str) -> str:
        async with recorder.run(source="agent_call", session_id=session, caller="agent.team-a.caller",
                                model="m") as run:  # fmt: skip
            run.messages([{"role": "user", "content": f"question of {session}"},
                          {"role": "assistant", "content": f"answer of {session}"}])
            run.ended(outcome="Succeeded")
        return run.run_id

    try:
        learned = await helpers_run("s1")  # the run id the helper's answer to the squatter names
        prefix, _, suffix = learned.rpartition("-")
        claimed = [learned, *(f"{prefix}-{int(suffix) + n}" if suffix.isdigit() else f"{prefix}-{secrets.token_hex(12)}"
                              for n in range(1, 3001))]  # fmt: skip
        now = datetime.datetime.now(datetime.UTC)
        for start in range(0, len(claimed), 200):
            await squatter.publish(queue=CONSOLE_RUNS, body=RunEvents(events=[
                RunStarted(id=event_id(), run_id=run_id, at=now, source="chat", session_id="fake", caller="http",
                           model="m") for run_id in claimed[start:start + 200]]))  # fmt: skip
        following = await helpers_run("s2")  # the helper's next run: another caller's call

        async def both_recorded_as_the_helpers() -> None:
            for run_id, session in ((learned, "s1"), (following, "s2")):
                run = await store.get_run(run_id)
                assert run is not None and (run.agent, run.session_id, run.outcome) == ("helper", session, "Succeeded")
                assert [entry.data["content"] for entry in run.timeline] == [f"question of {session}",
                                                                             f"answer of {session}"]

        await eventually(both_recorded_as_the_helpers, within=30)
        assert (await store.list_runs(filters=RunFilter(agent="squatter"))).runs == []
        assert metrics.events.labels("refused_owner")._value.get() == len(claimed)
    finally:
        await recorder.close()
        await writer.stop()
        await store.close()
