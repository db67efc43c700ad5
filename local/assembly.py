"""Turn manifests into agent configs with the operator's own resolution, then apply local overrides."""

from __future__ import annotations

from dataclasses import dataclass

from rockbot.contracts import agent_config as cfg
from rockbot.local.manifests import ManifestError, Manifests
from rockbot.operator.resolving import resolve_agent
from rockbot.resources import Agent
from rockbot.resources.common import SecretKeyRef

#: Locally nothing needs these Secrets: the bus is in process and the HTTP API is not served.
_BUS = SecretKeyRef(name="local-bus", key="amqp-url")
_TOKEN = SecretKeyRef(name="local-http-token", key="token")
#: The set whose tools talk to the operator: locally the scheduler answers them (`LocalScheduler.tool_set`).
_SCHEDULING = "scheduling"


@dataclass
class LocalModel:
    """The endpoint every local agent uses (from flags or the OPENAI_* environment); without a `base_url`, each
    Agent's own `spec.model`, with its key from a Secret manifest (or `api_key_env` when there is none)."""

    base_url: str | None
    name: str | None
    api_key_env: str | None


@dataclass
class AssembledAgent:
    config: cfg.AgentConfig
    #: Environment the runtime reads secrets from: Secret-manifest values under their wired names.
    env: dict[str, str]
    warnings: list[str]
    #: Whether it has the `scheduling` set, which the local scheduler provides instead of the operator.
    scheduling: bool = False


def assemble(manifests: Manifests, *, model: LocalModel) -> dict[str, AssembledAgent]:
    """One resolved config per Agent, exactly as the operator would render it, pointed at `model`."""
    secret_keys = {name: set(values) for name, values in manifests.secrets.items()}
    secret_keys |= {_BUS.name: {_BUS.key}, _TOKEN.name: {_TOKEN.key}}
    assembled = {}
    problems = []
    for name, body in manifests.agents.items():
        agent = Agent.model_validate(body)
        resolution = resolve_agent(
            agent=agent,
            tools=list(manifests.tools.values()),
            agents=manifests.agents,
            secret_keys=secret_keys,
            bus_secret=_BUS,
            http_token_secret=_TOKEN,
        )
        builtins = [name for name in resolution.config.builtin_tools if name != _SCHEDULING]
        env = {
            item.env: manifests.secrets[item.ref.name][item.ref.key]
            for item in resolution.secret_env
            if item.ref.key in manifests.secrets.get(item.ref.name, {})
        }
        own = resolution.config.model
        api_key = cfg.SecretEnv(env=model.api_key_env) if model.api_key_env else None
        if model.base_url is None and own.api_key is not None and own.api_key.env in env:
            api_key = own.api_key
        elif model.base_url is None and own.api_key is not None and api_key is None:
            ref = agent.spec.model.api_key_secret_ref
            problems.append(
                f"{manifests.files[('Agent', name)]}: Agent {name!r}: spec.model.apiKeySecretRef: the key for "
                f"{own.base_url} is in Secret {ref.name!r} (key {ref.key!r}), which is not in these files: add it as "
                "a kind: Secret document, export OPENAI_API_KEY, or point every agent at another endpoint with "
                "OPENAI_BASE_URL"  # type: ignore[union-attr]
            )
        memory = resolution.config.long_term_memory
        defaulted = agent.spec.memory and agent.spec.memory.long_term and agent.spec.memory.long_term.embeddings
        if memory is not None and defaulted and defaulted.base_url is None:  # embeddings follow the model's endpoint
            memory = memory.model_copy(update={"embeddings": memory.embeddings.model_copy(
                update={"base_url": model.base_url or own.base_url, "api_key": api_key})})
        config = resolution.config.model_copy(
            update={
                "long_term_memory": memory,
                "model": own.model_copy(
                    update={
                        "base_url": model.base_url or own.base_url,
                        "name": model.name or own.name,
                        "api_key": api_key,
                    }
                ),
                "builtin_tools": builtins,
                "http_token": None,
            }
        )
        assembled[name] = AssembledAgent(
            config=config,
            env=env,
            warnings=list(resolution.tool_problems),
            scheduling=_SCHEDULING in resolution.config.builtin_tools,
        )
    if problems:
        raise ManifestError(problems)
    return assembled
