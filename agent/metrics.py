"""Prometheus metrics of one agent runtime, in its own registry (so several runtimes can share a process).

Names are part of the product's contract (dashboards use them): tool calls are counted and timed
by tool and status (`ok` or the error code); model requests are counted by status and tokens by
kind (`prompt`, `completion`). A tool name the model invented is labelled `<unknown>`: the
model can write any string, and each one would otherwise become a new time series.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from rockbot.agent.llm import Usage
from rockbot.agent.registry import ToolOutcome

UNKNOWN_TOOL = "<unknown>"


class AgentMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.tool_duration = Histogram(
            "rockbot_tool_invoke_duration_seconds",
            "Time a tool call took, from validation to result.",
            ["tool", "status"],
            registry=self.registry,
            buckets=(0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
        )
        self.tool_invocations = Counter(
            "rockbot_tool_invocations_total", "Tool calls, by tool and status.", ["tool", "status"],
            registry=self.registry,
        )
        self.llm_requests = Counter(
            "rockbot_llm_requests_total", "Requests to the model endpoint, by HTTP status.", ["model", "status"],
            registry=self.registry,
        )
        self.llm_tokens = Counter(
            "rockbot_llm_tokens_total", "Tokens the model endpoint reported, by kind.", ["model", "kind"],
            registry=self.registry,
        )

    def observe_tool(self, outcome: ToolOutcome) -> None:
        tool = outcome.name if outcome.known else UNKNOWN_TOOL
        self.tool_duration.labels(tool=tool, status=outcome.status).observe(outcome.duration_seconds)
        self.tool_invocations.labels(tool=tool, status=outcome.status).inc()

    def llm_observer(self, model: str):
        def observe(status: str, usage: Usage | None) -> None:
            self.llm_requests.labels(model=model, status=status).inc()
            if usage is not None:
                self.llm_tokens.labels(model=model, kind="prompt").inc(usage.prompt_tokens)
                self.llm_tokens.labels(model=model, kind="completion").inc(usage.completion_tokens)

        return observe

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
