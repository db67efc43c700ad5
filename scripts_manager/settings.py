"""The scripts-manager's settings, all from `ROCKBOT_*` environment variables (see the chart)."""

from __future__ import annotations

import math
import urllib.parse
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from rockbot.bus.topology import MAX_MESSAGE_BYTES
from rockbot.contracts.files import MAX_WRITTEN_BYTES
from rockbot.kube.quantity import parse_quantity
from rockbot.reachability import check_targets
from rockbot.scripts_manager.backends.outputs import OutputBounds
from rockbot.settings_fields import CommaSeparated

#: What script and input may add up to: the runner reads a job line of at most 16 MiB, and JSON may
#: write a byte as six (`\u0001`).
JOB_BUDGET_BYTES = 2 * 1024 * 1024


def quantity_bytes(quantity: str) -> int:
    """A Kubernetes byte quantity ("256Mi") as a whole number of bytes (the local sandbox's rlimits)."""
    value = parse_quantity(quantity)
    if value <= 0:
        raise ValueError(f"{quantity!r} is not a positive number of bytes such as 256Mi, 1Gi or 500M")
    return math.ceil(value)


def cpu_millicores(quantity: str) -> int:
    """A Kubernetes CPU quantity ("250m", "0.5", "2") in millicores, to compare requests with the maximum."""
    value = parse_quantity(quantity)
    if value <= 0:
        raise ValueError(f"{quantity!r} is not a positive CPU quantity such as 250m, 0.5 or 2")
    return math.ceil(value * 1000)


#: What script pods must not reach, as the chart sets it by default (`broker` comes from ROCKBOT_AMQP_URL).
DEFAULT_TARGETS = {
    "clusterDns": ["dns:kubernetes.default.svc.cluster.local"],
    "kubernetesApi": ["tcp://kubernetes.default.svc.cluster.local:443"],
    "metadata": ["tcp://169.254.169.254:80"],
    "outside": ["tcp://1.1.1.1:443"],
}


class PoolClass(BaseModel):
    """A limits class the warm pool keeps `size` idle pods of (`CPU/MEMORY=SIZE` in ROCKBOT_SCRIPTS_POOL)."""

    model_config = ConfigDict(frozen=True)

    cpu: str
    memory: str
    size: Annotated[int, Field(ge=0, le=64)]

    @field_validator("cpu")
    @classmethod
    def _cpu(cls, value: str) -> str:
        cpu_millicores(value)
        return value

    @field_validator("memory")
    @classmethod
    def _memory(cls, value: str) -> str:
        quantity_bytes(value)
        return value

    @property
    def label(self) -> str:
        """The class as a label value: millicores and bytes, so `0.5/256Mi` and `500m/268435456` are one."""
        return f"{cpu_millicores(self.cpu)}m-{quantity_bytes(self.memory)}"

    def fits(self, *, cpu: str, memory: str) -> bool:
        return (cpu_millicores(cpu), quantity_bytes(memory)) == (cpu_millicores(self.cpu), quantity_bytes(self.memory))


class ScriptsManagerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ROCKBOT_", extra="ignore")

    amqp_url: SecretStr | None = None
    health_host: str = "0.0.0.0"
    health_port: Annotated[int, Field(ge=0, le=65535)] = 8080
    drain_seconds: Annotated[float, Field(ge=0)] = 20.0

    # Which sandbox: `pods` in a cluster, `local` for development; unset means pods when the process
    # runs inside Kubernetes (KUBERNETES_SERVICE_HOST is set), local otherwise.
    scripts_backend: Literal["pods", "local"] | None = None
    scripts_concurrency: Annotated[int, Field(ge=1, le=256)] = 4
    # Each agent's fair share (see sharing.py): requests taken off the queue ahead of a free sandbox
    # (at least the concurrency), and how many of one agent's scripts run at once.
    scripts_prefetch: Annotated[int, Field(ge=1, le=4096)] = 64
    scripts_per_agent: Annotated[int, Field(ge=1, le=256)] = 2
    # How many of one agent's requests the manager holds (waiting or running); past that it answers the agent's
    # new ones at once with Unavailable, so a backlog never fills the prefetch ahead of other agents.
    scripts_queued_per_agent: Annotated[int, Field(ge=1, le=4096)] = 16
    # Sandboxes kept between calls for Agents with scriptSessions PerConversation (each holds its memory while
    # idle): at most this many per manager, and per agent (an agent past its own ends its least recently used
    # idle one; past the manager's, a new conversation's call is refused, retryable, until one ends).
    scripts_sessions: Annotated[int, Field(ge=0, le=4096)] = 16
    scripts_sessions_per_agent: Annotated[int, Field(ge=1, le=4096)] = 4

    # Where an agent's script limits come from (limits.py): `agents`, its Agent's spec.scriptLimits, mirrored
    # from the Agents of `namespaces` (all when empty); `defaults`, the defaults below for every agent.
    scripts_agent_limits: Literal["agents", "defaults"] = "defaults"
    namespaces: CommaSeparated = Field(default_factory=list)

    # Limits every request is checked against (answered with InvalidArguments naming the field).
    scripts_max_script_bytes: Annotated[int, Field(ge=1)] = 256 * 1024
    scripts_max_input_bytes: Annotated[int, Field(ge=0)] = 512 * 1024
    scripts_max_timeout_seconds: Annotated[float, Field(gt=0)] = 300.0
    scripts_max_output_bytes: Annotated[int, Field(ge=1024)] = 256 * 1024  # per stream
    scripts_max_packages: Annotated[int, Field(ge=0)] = 20
    # What comes back from a script's /output: files, bytes of one, bytes of all (see `output_bounds`).
    scripts_output_files: Annotated[int, Field(ge=0, le=1000)] = 20
    scripts_output_file_bytes: Annotated[int, Field(ge=0)] = 10 * 1024 * 1024
    scripts_output_bytes: Annotated[int, Field(ge=0)] = 50 * 1024 * 1024

    # Resources of one script (pod requests = limits; the local sandbox turns memory into an rlimit):
    # the defaults (every agent's with ROCKBOT_SCRIPTS_AGENT_LIMITS=defaults), and the most an Agent's
    # spec.scriptLimits may ask for.
    scripts_cpu: str = "500m"
    scripts_memory: str = "256Mi"
    scripts_max_cpu: str = "1"
    scripts_max_memory: str = "1Gi"
    scripts_ephemeral_storage: str = "128Mi"
    scripts_tmp_size: str = "64Mi"

    # Which packages scripts may name in `pip_packages` (empty: none). Pods: they must already be in
    # ROCKBOT_SCRIPTS_IMAGE. Local: installed on first use into a content-addressed cache.
    scripts_allowed_packages: CommaSeparated = Field(default_factory=list)
    scripts_pip_index_url: str | None = None
    scripts_pip_find_links: str | None = None
    # Local: only the manager may write it (checked). Unset: /var/cache/rockbot/packages as root, else
    # $XDG_CACHE_HOME/rockbot/packages.
    scripts_package_cache: Path | None = None

    # Pod backend.
    scripts_namespace: str = "rockbot-scripts"
    scripts_image: str = "python:3.12-slim"
    scripts_image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    scripts_runtime_class: str | None = None
    # The PriorityClass of script pods and the isolation canary's (None: the cluster's default priority): above
    # the cluster's batch work, they are scheduled first on a full node, or preempt it.
    scripts_priority_class: str | None = None
    scripts_pod_start_seconds: Annotated[float, Field(gt=0)] = 120.0  # scheduling and image pull
    scripts_sweep_interval_seconds: Annotated[float, Field(gt=0)] = 60.0
    scripts_sweep_grace_seconds: Annotated[float, Field(ge=0)] = 120.0
    # Each manager instance holds a Lease in the scripts namespace, renewed every third of this; once another
    # instance has seen it unchanged this long, it deletes the instance's pods and answers their jobs
    # (backends/reaping.py). The pod's name (the downward API's metadata.name) names the Lease, so a process
    # restarted in the same pod knows its predecessor is dead and cleans up after it at once.
    scripts_lease_seconds: Annotated[int, Field(ge=3, le=300)] = 15
    pod_name: str | None = None

    # Warm pool (pod backend): idle pods kept per limits class, `CPU/MEMORY=SIZE,...` (e.g.
    # `500m/256Mi=2`); empty or size 0: off. Each idle pod reserves its CPU and memory on a node.
    scripts_pool: Annotated[list[PoolClass], NoDecode] = Field(default_factory=list)
    # An idle pod's activeDeadlineSeconds (the kubelet stops it then, whatever happens to the manager);
    # the manager replaces its pods before they are too old for the longest script.
    scripts_pool_pod_lifetime_seconds: Annotated[float, Field(gt=0)] = 3600.0

    # Isolation canary (canary.py): what a script must not reach, by probe (an empty list turns a probe
    # off; `broker` defaults to ROCKBOT_AMQP_URL's address), how often, and whether to refuse scripts
    # while the last canary reached anything or could not run. Pods only: the local sandbox's canary
    # tries listeners the manager opens on 127.0.0.1. A change of the scripts namespace's NetworkPolicies
    # proves again once no other change came for debounce seconds (policy_watch.py).
    scripts_isolation_targets: dict[str, list[str]] = Field(default_factory=lambda: dict(DEFAULT_TARGETS))
    scripts_isolation_interval_seconds: Annotated[float, Field(gt=0)] = 600.0
    scripts_isolation_enforce: bool = True
    scripts_isolation_debounce_seconds: Annotated[float, Field(ge=0)] = 5.0
    # The CPU of a canary's pod (at most ROCKBOT_SCRIPTS_CPU): little, so that it finds room on a full node (canary.py).
    scripts_isolation_cpu: str = "100m"

    # Local backend.
    scripts_local_isolation: Literal["auto", "bwrap", "unshare", "unsafe-none"] = "auto"
    # Default: the first of this process's base interpreter and /usr/bin/python3 that starts in the sandbox.
    scripts_local_python: str | None = None

    @property
    def max_request_bytes(self) -> int:
        """The largest request body read: a script and input at their limits, every byte escaped in JSON (6x).

        Anything longer cannot be a valid request, so it is refused before it is parsed.
        """
        return 6 * (self.scripts_max_script_bytes + self.scripts_max_input_bytes) + 64 * 1024

    @property
    def output_bounds(self) -> OutputBounds:
        """The bounds of a script's /output when its files travel in the reply: the settings, within what one reply
        carries (the artifacts, base64-encoded, beside both output streams at their cap, every byte escaped in
        JSON). A request that names where its files are kept (`output_files`) gets `kept_output_bounds`."""
        room = max((MAX_MESSAGE_BYTES - 12 * self.scripts_max_output_bytes - 256 * 1024) * 3 // 4, 0)
        return OutputBounds(
            files=self.scripts_output_files,
            file_bytes=min(self.scripts_output_file_bytes, room),
            total_bytes=min(self.scripts_output_bytes, room),
        )

    @property
    def kept_output_bounds(self) -> OutputBounds:
        """The bounds of a script's /output when the manager keeps its files in the console itself, a chunk at a
        time (output_files.py): the settings, up to the most the console keeps of one file."""
        return OutputBounds(
            files=self.scripts_output_files,
            file_bytes=min(self.scripts_output_file_bytes, MAX_WRITTEN_BYTES),
            total_bytes=self.scripts_output_bytes,
        )

    @field_validator("scripts_isolation_targets")
    @classmethod
    def _targets(cls, value: dict[str, list[str]]) -> dict[str, list[str]]:
        return check_targets(value)

    @property
    def isolation_targets(self) -> dict[str, list[str]]:
        """The canary's targets, with the broker's address unless `broker` is given."""
        targets = dict(self.scripts_isolation_targets)
        if "broker" not in targets and self.amqp_url is not None:
            url = urllib.parse.urlsplit(self.amqp_url.get_secret_value())
            if url.hostname:
                targets["broker"] = [f"tcp://{url.hostname}:{url.port or (5671 if url.scheme == 'amqps' else 5672)}"]
        return targets

    @field_validator("scripts_pool", mode="before")
    @classmethod
    def _pool_classes(cls, value: object) -> object:
        if not isinstance(value, str):
            return value
        classes = []
        for item in (part.strip() for part in value.split(",")):
            if not item:
                continue
            limits, _, size = item.partition("=")
            cpu, _, memory = limits.partition("/")
            if not (cpu and memory and size.strip().isdigit()):
                raise ValueError(f"{item!r} is not CPU/MEMORY=SIZE, e.g. 500m/256Mi=2")
            classes.append({"cpu": cpu.strip(), "memory": memory.strip(), "size": int(size)})
        return classes

    @field_validator("scripts_memory", "scripts_max_memory", "scripts_ephemeral_storage", "scripts_tmp_size")
    @classmethod
    def _byte_quantity(cls, value: str) -> str:
        quantity_bytes(value)
        return value

    @field_validator("scripts_cpu", "scripts_max_cpu", "scripts_isolation_cpu")
    @classmethod
    def _cpu_quantity(cls, value: str) -> str:
        cpu_millicores(value)
        return value

    @model_validator(mode="after")
    def _defaults_within_maximums(self) -> ScriptsManagerSettings:
        if cpu_millicores(self.scripts_cpu) > cpu_millicores(self.scripts_max_cpu):
            raise ValueError(f"ROCKBOT_SCRIPTS_CPU={self.scripts_cpu} is over ROCKBOT_SCRIPTS_MAX_CPU="
                             f"{self.scripts_max_cpu}: lower the default or raise the maximum")
        if quantity_bytes(self.scripts_memory) > quantity_bytes(self.scripts_max_memory):
            raise ValueError(f"ROCKBOT_SCRIPTS_MEMORY={self.scripts_memory} is over ROCKBOT_SCRIPTS_MAX_MEMORY="
                             f"{self.scripts_max_memory}: lower the default or raise the maximum")
        return self

    @model_validator(mode="after")
    def _pool_within_limits(self) -> ScriptsManagerSettings:
        for pool in self.scripts_pool:
            if (cpu_millicores(pool.cpu) > cpu_millicores(self.scripts_max_cpu)
                    or quantity_bytes(pool.memory) > quantity_bytes(self.scripts_max_memory)):
                raise ValueError(f"ROCKBOT_SCRIPTS_POOL: {pool.cpu}/{pool.memory} is over ROCKBOT_SCRIPTS_MAX_CPU/"
                                 f"_MAX_MEMORY ({self.scripts_max_cpu}/{self.scripts_max_memory}): no job could use it")
        if self.scripts_pool_pod_lifetime_seconds < 2 * self.scripts_max_timeout_seconds + 60:
            raise ValueError(
                f"ROCKBOT_SCRIPTS_POOL_POD_LIFETIME_SECONDS={self.scripts_pool_pod_lifetime_seconds:g} is under twice "
                f"ROCKBOT_SCRIPTS_MAX_TIMEOUT_SECONDS plus a minute: warm pods would be replaced before they could "
                "serve the longest script; raise it"
            )
        return self

    @model_validator(mode="after")
    def _fits_a_job(self) -> ScriptsManagerSettings:
        total = self.scripts_max_script_bytes + self.scripts_max_input_bytes
        if total > JOB_BUDGET_BYTES:
            raise ValueError(
                f"ROCKBOT_SCRIPTS_MAX_SCRIPT_BYTES + ROCKBOT_SCRIPTS_MAX_INPUT_BYTES = {total} bytes, over the "
                f"{JOB_BUDGET_BYTES} a script pod's runner accepts in one job: lower one of them"
            )
        return self
