"""The operator's own settings: environment (`ROCKBOT_*`) and flags, through one typed model."""

from __future__ import annotations

import json
from typing import Annotated, Literal

from pydantic import BeforeValidator, Field, IPvAnyNetwork, SecretStr, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from rockbot import __version__
from rockbot.reachability import check_targets
from rockbot.settings_fields import CommaSeparated, split_commas

#: What agent pods must not reach by default (they may reach DNS, the bus and their model endpoint).
AGENT_FORBIDDEN = {
    "kubernetesApi": ["tcp://kubernetes.default.svc.cluster.local:443"],
    "metadata": ["tcp://169.254.169.254:80"],
    "outside": ["tcp://1.1.1.1:443"],
}


class OperatorSettings(BaseSettings):
    """Every field is `ROCKBOT_<FIELD>` in the environment and `--<field>` on `rockbot operator` (which wins)."""

    model_config = SettingsConfigDict(env_prefix="ROCKBOT_", extra="ignore")

    namespaces: CommaSeparated = Field(
        default_factory=list, description="Namespaces to watch (comma-separated); empty watches the whole cluster."
    )
    agent_image: str = Field(default=f"ghcr.io/rockbot-dev/rockbot:{__version__}", description="Default agent image.")
    amqp_url: str | None = Field(
        default=None,
        description="The operator's own broker login, amqp://service.operator:PASSWORD@host:5672/vhost (scheduling).",
    )
    broker_management_url: str | None = Field(
        default=None,
        description="RabbitMQ's management API (http://host:15672/): with it the operator gives every Agent its own "
        "broker user, bus Secret and inbox; without it agent pods get no bus.",
    )
    broker_admin_username: str = Field(
        default="rockbot", description="A broker administrator, for management API calls only."
    )
    broker_admin_password: SecretStr | None = Field(default=None, description="That administrator's password.")
    broker_agent_url: str | None = Field(
        default=None,
        description="The broker as agent pods reach it, without credentials (amqp://host:5672/vhost); default: the "
        "address of amqp_url.",
    )
    scripts_manager_amqp_url: SecretStr | None = Field(
        default=None, description="The scripts-manager's login, whose broker user the operator makes at start-up."
    )
    gateway_amqp_url: SecretStr | None = Field(
        default=None, description="The gateway's login (Triggers), whose broker user the operator makes at start-up."
    )
    console_amqp_url: SecretStr | None = Field(
        default=None, description="The console's login (run events, histories), whose broker user the operator makes."
    )
    runs_record: Literal["Full", "Metadata", "None"] = Field(
        default="Full", description="What the run store keeps of an Agent's turns when its spec.runs says nothing."
    )
    runs_retention_days: int = Field(
        default=30, ge=1, le=3650, description="Days a run is kept when the Agent's spec.runs says nothing."
    )
    scripts_namespace: str = Field(
        default="rockbot-scripts", description="Namespace where the scripts-manager runs script pods."
    )
    agent_port: int = Field(default=8080, ge=1, le=65535, description="HTTP port of agent pods and their Service.")
    agent_otlp_endpoint: str | None = Field(
        default=None,
        description="OTLP/HTTP endpoint agent pods export their traces to (their OTEL_EXPORTER_OTLP_ENDPOINT); "
        "none: agents export no traces.",
    )
    agent_console_url: str | None = Field(
        default=None,
        description="The console's address as people reach it (agent pods' ROCKBOT_CONSOLE_URL): the links an "
        "agent's answers on its OpenAI endpoint give to a turn's files; none: a path on the console.",
    )
    agent_capture_content: bool = Field(
        default=False,
        description="Let agents put prompts, answers and tool arguments and results into their spans.",
    )
    egress_canary: bool = Field(
        default=False,
        description="Run the egress canary of agent pods (egress_canary.py) and report EgressRestricted on Agents; "
        "needs pods create/get/watch/delete and networkpolicies list in the Agent namespaces.",
    )
    egress_canary_targets: dict[str, list[str]] = Field(
        default_factory=lambda: dict(AGENT_FORBIDDEN),
        description="What agent pods must not reach, by probe (tcp://HOST:PORT, dns:NAME, dns://SERVER:PORT/NAME); "
        "an empty list turns a probe off.",
    )
    egress_canary_interval_seconds: float = Field(default=600.0, gt=0, description="Seconds a canary's proof holds.")
    private_networks: Annotated[list[IPvAnyNetwork], NoDecode, BeforeValidator(split_commas)] = Field(
        default_factory=list,
        description="Non-public networks (comma-separated CIDRs) that REST Tools may reach and Agents' "
        "webBrowse.allowedNetworks may name: loopback, private (the cluster's Service and pod ranges), link-local "
        "(the cloud metadata endpoint) and other non-public addresses are refused unless listed; a cluster "
        "administrator's call, never a Tool's or Agent's author's.",
    )
    leader_lease: str = Field(
        default="",
        description="The Lease (coordination.k8s.io) operator replicas elect their leader with: only its holder "
        "works, the others stand by (leadership.py); empty: no election, so run one replica only.",
    )
    leader_lease_namespace: str = Field(
        default="", validate_default=True, description="The leader Lease's namespace (the operator's own)."
    )
    leader_lease_seconds: int = Field(
        default=10, ge=3, le=300,
        description="Seconds a standby waits, on its own clock, for a leader that stopped renewing the Lease before "
        "taking over (a leader stopped cleanly hands it over at once).",
    )
    log_format: Literal["json", "text"] = Field(default="json", description="Log format.")
    resync_seconds: float = Field(default=300.0, description="Period of the safety resync of every Agent.")

    @field_validator("leader_lease_namespace")
    @classmethod
    def _lease_namespace(cls, value: str, info: ValidationInfo) -> str:
        if info.data.get("leader_lease") and not value:
            raise ValueError("a leader_lease needs its namespace, the operator's own")
        return value

    @field_validator("egress_canary_targets", mode="before")
    @classmethod
    def _json(cls, value: object) -> object:
        return json.loads(value) if isinstance(value, str) else value  # a flag's value

    @field_validator("egress_canary_targets")
    @classmethod
    def _targets(cls, value: dict[str, list[str]]) -> dict[str, list[str]]:
        return check_targets(value)
