"""Prometheus metrics of one agent runtime, in its own registry (so several runtimes can share a process).

Names are part of the product's contract (the chart's dashboard uses them). Every series carries
the Agent's name as `agent` (its namespace is the scrape target's). Tool calls are counted and
timed by tool and status (`ok` or the error code); model requests are counted and timed by model
and status (`200`, `429`, `error`...) and their tokens counted by kind (`prompt`, `completion`);
turns are counted by source (`http` or the inbox request's kind) and outcome, with the tool calls
each made. A tool name the model invented is labelled `<unknown>`: the model can write any string,
and each one would otherwise become a new time series.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from rockbot.agent.llm import Attempt
from rockbot.agent.registry import UNKNOWN_TOOL, ToolOutcome

_SECONDS = (0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class AgentMetrics:
    def __init__(self, *, agent: str) -> None:
        self.agent = agent
        self.registry = CollectorRegistry()
        self.tool_duration = Histogram(
            "rockbot_tool_invoke_duration_seconds", "Time a tool call took, from validation to result.",
            ["agent", "tool", "status"], registry=self.registry, buckets=_SECONDS,
        )  # fmt: skip
        self.tool_invocations = Counter(
            "rockbot_tool_invocations_total", "Tool calls, by tool and status.", ["agent", "tool", "status"],
            registry=self.registry,
        )  # fmt: skip
        self.llm_requests = Counter(
            "rockbot_llm_requests_total", "Requests to the model endpoint, by HTTP status.",
            ["agent", "model", "status"], registry=self.registry,
        )  # fmt: skip
        self.llm_duration = Histogram(
            "rockbot_llm_request_duration_seconds", "Time one request to the model endpoint took (a streamed "
            "answer to its end), by HTTP status.", ["agent", "model", "status"], registry=self.registry,
            buckets=_SECONDS,
        )  # fmt: skip
        self.llm_tokens = Counter(
            "rockbot_llm_tokens_total", "Tokens the model endpoint reported, by kind (prompt: in, completion: out).",
            ["agent", "model", "kind"], registry=self.registry,
        )  # fmt: skip
        self.turns = Counter(
            "rockbot_agent_turns_total", "Turns (one request answered by the tool loop), by source and outcome "
            "(answered, iteration_limit, budget_exhausted, llm_error, failed).",
            ["agent", "source", "outcome"], registry=self.registry,
        )  # fmt: skip
        self.turn_tool_calls = Histogram(
            "rockbot_agent_turn_tool_calls", "Tool calls one turn made.", ["agent"], registry=self.registry,
            buckets=(0, 1, 2, 3, 5, 8, 13, 21, 34, 55),
        )  # fmt: skip
        self.approvals = Counter(
            "rockbot_tool_approvals_total", "Tool calls that waited for a person, by how the wait ended (approved, "
            "denied, timed_out).", ["agent", "tool", "outcome"], registry=self.registry,
        )  # fmt: skip
        self.approvals_waiting = Gauge(
            "rockbot_tool_approvals_waiting", "Tool calls waiting for a person's approval now.", ["agent"],
            registry=self.registry,
        )  # fmt: skip

    def observe_tool(self, outcome: ToolOutcome) -> None:
        tool = outcome.name if outcome.known else UNKNOWN_TOOL
        self.tool_duration.labels(self.agent, tool, outcome.status).observe(outcome.duration_seconds)
        self.tool_invocations.labels(self.agent, tool, outcome.status).inc()

    def observe_llm(self, attempt: Attempt) -> None:
        self.llm_requests.labels(self.agent, attempt.model, attempt.status).inc()
        self.llm_duration.labels(self.agent, attempt.model, attempt.status).observe(attempt.seconds)
        if attempt.usage is not None:
            self.llm_tokens.labels(self.agent, attempt.model, "prompt").inc(attempt.usage.prompt_tokens)
            self.llm_tokens.labels(self.agent, attempt.model, "completion").inc(attempt.usage.completion_tokens)

    def observe_turn(self, *, source: str, outcome: str, tool_calls: int) -> None:
        self.turns.labels(self.agent, source, outcome).inc()
        self.turn_tool_calls.labels(self.agent).observe(tool_calls)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
