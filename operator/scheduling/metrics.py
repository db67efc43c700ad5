"""Prometheus metrics of the operator's scheduler, in a registry of its own (served on the operator's /metrics).

Runs are counted by outcome as the history records them (Succeeded, Failed, Missed, Replaced), and
the lag of a run is the time from its slot to its trigger being sent to the agent's inbox.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram


class SchedulingMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.runs = Counter(
            "rockbot_scheduled_runs", "ScheduledTask runs recorded in a task's history, by outcome.",
            ["outcome"], registry=self.registry,
        )  # fmt: skip
        self.lag = Histogram(
            "rockbot_scheduled_run_lag_seconds", "Time from a run's slot to its trigger sent to the agent's inbox.",
            registry=self.registry, buckets=(0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300, 900, 3600),
        )  # fmt: skip
