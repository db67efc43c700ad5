"""The gateway's settings, all from `ROCKBOT_*` environment variables (see the chart)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from rockbot.settings_fields import CommaSeparated


class GatewaySettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ROCKBOT_", extra="ignore")

    #: The gateway's own broker login (`service.gateway`), made by the operator at its start-up.
    amqp_url: SecretStr | None = None
    #: Namespaces whose Triggers it serves (comma-separated); empty: every namespace.
    namespaces: CommaSeparated = Field(default_factory=list)
    #: Whether a Trigger may select Events of namespaces other than its own.
    cross_namespace_events: bool = False

    webhook_host: str = "0.0.0.0"
    webhook_port: Annotated[int, Field(ge=0, le=65535)] = 8443
    #: Where senders reach the webhooks (an Ingress, a load balancer), for the URL in each Trigger's status.
    public_url: str | None = None
    #: Serve the webhooks over TLS with this certificate and key (PEM files, e.g. a mounted Secret).
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None

    health_host: str = "0.0.0.0"
    health_port: Annotated[int, Field(ge=0, le=65535)] = 8080
    #: How often every Trigger's conditions are checked again (a Secret made after its Trigger).
    resync_seconds: Annotated[float, Field(gt=0)] = 60.0
    log_format: Literal["json", "text"] = "json"

    @field_validator("public_url")
    @classmethod
    def _no_trailing_slash(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError(f"{value!r} is not an http:// or https:// URL, e.g. https://hooks.example.com")
        return None if value is None else value.rstrip("/")

    @model_validator(mode="after")
    def _certificate_and_key(self) -> GatewaySettings:
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("set both ROCKBOT_TLS_CERT_FILE and ROCKBOT_TLS_KEY_FILE, or neither")
        return self
