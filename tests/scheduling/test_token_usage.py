"""Agents' token usage: reported over the bus, added up by the operator into Agent.status.usage, and the
daily budget held over replicas and restarts (the real API server, in-memory bus)."""

from __future__ import annotations

import datetime
from collections.abc import AsyncIterator

import pytest

from rockbot.agent.budget import BudgetExhausted, TokenBudget
from rockbot.agent.llm import Attempt, Usage
from rockbot.agent.usage_reports import UsageReporter
from rockbot.bus import OPERATOR, SCRIPTS_MANAGER, AccessRefused, MemoryBroker, Principal
from rockbot.bus.topology import OPERATOR_USAGE, agent_replies
from rockbot.contracts.usage import UsageReport, UsageTotal
from rockbot.kube import AGENTS
from rockbot.operator.usage import UsageLedger
from tests.buses import login
from tests.scheduling.conftest import Cluster
from tests.waiting import eventually

TODAY = datetime.datetime.now(datetime.UTC).date()


def used(budget: TokenBudget, prompt: int, completion: int = 0) -> None:
    budget.record(Attempt(model="m", status="200", usage=Usage(prompt_tokens=prompt, completion_tokens=completion),
                          seconds=0.1))


class Operator:
    """The operator's usage ledger on a memory broker, restartable; replicas of `helper` report to it."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.helper = Principal.agent(namespace=cluster.ns, name="helper")
        self.broker = MemoryBroker()
        self.ledger: UsageLedger | None = None

    async def start(self) -> UsageLedger:
        self.ledger = UsageLedger(kube=self.cluster.kube, bus=await login(self.broker, OPERATOR), flush_seconds=3600)
        await self.ledger.start()
        return self.ledger

    async def stop(self) -> None:
        if self.ledger is not None:
            await self.ledger.stop()

    async def replica(self, *, limit: int | None = 100) -> tuple[TokenBudget, UsageReporter]:
        budget = TokenBudget(tokens_per_day=limit, reported=True, first_total_seconds=5)
        reporter = UsageReporter(budget=budget, bus=await login(self.broker, self.helper), namespace=self.cluster.ns,
                                 name="helper", answer_seconds=5)
        return budget, reporter

    async def usage(self) -> dict:
        agent = await self.cluster.kube.get(AGENTS, namespace=self.cluster.ns, name="helper")
        return (agent.get("status") or {})["usage"]


@pytest.fixture
async def operator(cluster: Cluster) -> AsyncIterator[Operator]:
    await cluster.agent("helper")
    running = Operator(cluster)
    await running.start()
    yield running
    await running.stop()


async def test_the_replicas_of_an_agent_share_one_days_total_and_its_budget(operator: Operator) -> None:
    (first, first_reports), (second, second_reports) = await operator.replica(), await operator.replica()
    used(first, 30, 5)
    used(second, 50)
    assert await first_reports.report() and await second_reports.report()
    assert first.used().total_tokens == 35 and second.used().total_tokens == 85  # each knows the total so far
    await operator.ledger.flush()
    assert await operator.usage() == {"day": TODAY.isoformat(), "promptTokens": 80, "completionTokens": 5,
                                      "totalTokens": 85}
    used(second, 20)  # second goes over 100: it refuses at once, and first as soon as it hears of it
    with pytest.raises(BudgetExhausted, match="105 of 100 tokens today"):
        await second.admit()
    await first.admit()
    assert await second_reports.report() and await first_reports.report()
    with pytest.raises(BudgetExhausted, match="105 of 100 tokens today"):
        await first.admit()


async def test_a_restarted_agent_or_operator_goes_on_from_the_days_total_in_the_status(operator: Operator) -> None:
    budget, reports = await operator.replica()
    used(budget, 60)
    assert await reports.report()
    await operator.stop()  # writes what it holds
    assert (await operator.usage())["totalTokens"] == 60

    await operator.start()
    restarted, restarted_reports = await operator.replica()  # a new process: it knows nothing of the day yet
    assert await restarted_reports.report()  # its first report learns the day's total
    assert restarted.used().total_tokens == 60
    used(restarted, 40)
    assert await restarted_reports.report()
    with pytest.raises(BudgetExhausted, match="100 of 100"):
        await restarted.admit()
    await operator.ledger.flush()
    assert (await operator.usage())["totalTokens"] == 100


async def test_a_new_day_starts_the_total_afresh_and_a_late_report_of_yesterday_is_dropped(
    operator: Operator,
) -> None:
    bus = await login(operator.broker, operator.helper)
    replies = agent_replies(namespace=operator.cluster.ns, name="helper", slot=0)

    async def report(day: datetime.date, tokens: int) -> UsageTotal:
        delivery = await bus.request(queue=OPERATOR_USAGE, body=UsageReport(day=day, prompt_tokens=tokens),
                                     reply_queue=replies, correlation_id=f"r-{day}-{tokens}", timeout_seconds=5,
                                     responder=OPERATOR)
        return delivery.decode(UsageTotal)

    yesterday = TODAY - datetime.timedelta(days=1)
    assert (await report(yesterday, 70)).prompt_tokens == 70
    assert await report(TODAY, 5) == UsageTotal(day=TODAY, prompt_tokens=5)
    assert await report(yesterday, 1000) == UsageTotal(day=TODAY, prompt_tokens=5)


async def test_only_an_existing_agent_reporting_for_itself_is_counted(operator: Operator) -> None:
    with pytest.raises(AccessRefused):  # no service may even send one
        await (await login(operator.broker, SCRIPTS_MANAGER)).publish(
            queue=OPERATOR_USAGE, body=UsageReport(day=TODAY, prompt_tokens=5))
    ns = operator.cluster.ns
    ghost = Principal.agent(namespace=ns, name="ghost")  # a login, but no Agent (deleted)
    for sender, reply_to in ((ghost, f"agent.{ns}.ghost.scheduling-replies.t1"),
                             (operator.helper, f"agent.{ns}.ghost.scheduling-replies.t1")):  # answer to someone else
        await (await login(operator.broker, sender)).publish(
            queue=OPERATOR_USAGE, body=UsageReport(day=TODAY, prompt_tokens=5), reply_to=reply_to)

    async def both_refused() -> None:
        refused = await operator.broker.dead_letters()
        assert sorted(letter.user_id for letter in refused) == [f"agent.{ns}.ghost", f"agent.{ns}.helper"]

    await eventually(both_refused)
    await operator.ledger.flush()
    status = (await operator.cluster.kube.get(AGENTS, namespace=ns, name="helper")).get("status") or {}
    assert "usage" not in status
