"""The console's settings, all from `ROCKBOT_*` environment variables (see the chart)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from rockbot.settings_fields import CommaSeparated

#: Where the run store lives when nothing else is said: `rockbot local`'s and a developer's SQLite file.
DEFAULT_DATABASE = Path.home() / ".local" / "state" / "rockbot" / "runs.db"


class ConsoleSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ROCKBOT_", extra="ignore")

    #: The run store: postgresql://USER:PASSWORD@HOST:PORT/DB (the chart's, or an external one), or sqlite:///PATH.
    database_url: SecretStr = SecretStr(f"sqlite:///{DEFAULT_DATABASE}")
    #: The console's own broker login (`service.console`), made by the operator; none: record nothing from the bus.
    amqp_url: SecretStr | None = None
    #: Serve the pages and the read API (they need the cluster's API); false: only record runs and answer histories.
    serve_http: bool = True
    http_host: str = "0.0.0.0"
    http_port: Annotated[int, Field(ge=0, le=65535)] = 8080
    health_host: str = "0.0.0.0"
    health_port: Annotated[int, Field(ge=0, le=65535)] = 8081
    #: Run events one agent may send per second (and at once); past that its messages are refused, counted.
    events_per_second: Annotated[float, Field(gt=0)] = 500.0
    burst_events: Annotated[float, Field(gt=0)] = 5000.0
    #: The most long-term memories (and bytes of their text) one agent keeps over all its scopes, whatever its
    #: Agent's policy says (each scope's own bound is the Agent's spec.memory.longTerm).
    memory_max_items_per_agent: Annotated[int, Field(ge=1)] = 1_000_000
    memory_max_bytes_per_agent: Annotated[int, Field(ge=1)] = 1024 * 1024 * 1024
    #: How often runs (and memories) past their retention are deleted.
    retention_sweep_seconds: Annotated[float, Field(gt=0)] = 3600.0
    #: Seconds the cluster's answers about tokens and rights are kept (0-60).
    auth_cache_seconds: Annotated[float, Field(ge=0, le=60)] = 10.0
    #: Addresses of an authenticating proxy whose X-Forwarded-User headers are trusted (comma-separated CIDRs).
    auth_proxy_cidrs: CommaSeparated = Field(default_factory=list)
    #: A link to a run's trace in the tracing UI, `{trace_id}` filled in (e.g. https://jaeger.example.com/trace/{trace_id}).
    trace_url_template: str | None = None
    #: How long a chat turn may take (tools and approvals included) before the person is told it did not answer.
    chat_timeout_seconds: Annotated[float, Field(gt=0)] = 900.0
    log_format: Literal["json", "text"] = "json"
