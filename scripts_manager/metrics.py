"""Prometheus metrics of the scripts-manager, in a registry of its own (one per service instance)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class ScriptMetrics:
    def __init__(self, *, backend: str) -> None:
        self.registry = CollectorRegistry()
        self.runs = Counter(
            "rockbot_scripts_runs", "Script requests answered, by outcome "
            "(succeeded, exited_nonzero, timed_out, oom_killed, or an error code).",
            ["backend", "outcome"], registry=self.registry,
        )  # fmt: skip
        self.duration = Histogram(
            "rockbot_scripts_run_duration_seconds", "Time from taking a request to having its answer.",
            ["backend"], registry=self.registry,
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
        )  # fmt: skip
        self.queue_wait = Histogram(
            "rockbot_scripts_queue_wait_seconds", "Time a request waited in script.invoke before a manager took it "
            "(the sender's clock to the manager's).", ["backend"], registry=self.registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
        )  # fmt: skip
        self.in_flight = Gauge(
            "rockbot_scripts_in_flight", "Sandboxes (pods or local processes) running right now.",
            ["backend"], registry=self.registry,
        )  # fmt: skip
        buckets = (0.05, 0.1, 0.15, 0.25, 0.35, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10, 30, 60, 120, 300)
        self.first_instruction = Histogram(
            "rockbot_scripts_pod_time_to_first_instruction_seconds",
            "Pod backend: from taking a job to its script starting in a pod, warm (claimed from the pool) or cold.",
            ["path"], registry=self.registry, buckets=buckets,
        )  # fmt: skip
        self.pod_duration = Histogram(
            "rockbot_scripts_pod_run_duration_seconds",
            "Pod backend: from taking a job to having its answer, warm (claimed from the pool) or cold.",
            ["path"], registry=self.registry, buckets=buckets,
        )  # fmt: skip
        self.pool_size = Gauge(
            "rockbot_scripts_pool_size", "Idle warm pods this manager keeps, by limits class.",
            ["limits_class"], registry=self.registry,
        )  # fmt: skip
        self.pool_idle = Gauge(
            "rockbot_scripts_pool_idle_pods", "Warm pods of a limits class this manager keeps ready to take.",
            ["limits_class"], registry=self.registry,
        )  # fmt: skip
        self.pool_pod_start = Histogram(
            "rockbot_scripts_pool_pod_start_seconds", "Warm pods: from this manager's create to its watch showing "
            "the container running (how soon a claimed pod is replaced).",
            ["limits_class"], registry=self.registry, buckets=buckets,
        )  # fmt: skip
        self.pool_claims = Counter(
            "rockbot_scripts_pool_claims", "Warm pods claimed for a job, by limits class.",
            ["limits_class"], registry=self.registry,
        )  # fmt: skip
        self.pool_misses = Counter(
            "rockbot_scripts_pool_misses", "Jobs of a pooled class that did not get a warm pod first time "
            "(empty: none idle; failed: it died before the job reached it).",
            ["limits_class", "reason"], registry=self.registry,
        )  # fmt: skip
        self.replies_dropped = Counter(
            "rockbot_scripts_replies_dropped", "Answers that could not be delivered and were dropped (their "
            "request is not run again): no_queue (the asking process is gone), refused (the broker refused it).",
            ["reason"], registry=self.registry,
        )  # fmt: skip
        self.swept = Counter(
            "rockbot_scripts_swept_objects", "Leftover script pods deleted by the sweeper.",
            registry=self.registry,
        )  # fmt: skip
        self.reaped = Counter(
            "rockbot_scripts_reaped_pods", "Script pods of a dead manager instance deleted by this one, by whether "
            "a job waited on them (job: its asker was answered with a retryable error; idle: none).",
            ["kind"], registry=self.registry,
        )  # fmt: skip
        self.backend = backend
