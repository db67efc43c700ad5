"""Resolve an Agent's references into the tool set its model will see, and say what did not resolve.

Pure: the reconciler fetches Tools, Agents and Secret key names, this module decides. An Agent whose
tools only partly resolve still deploys with the tools that did (ToolsResolved=False names the rest):
one broken Tool should not take a working agent down, and the status lists exactly what it offers.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rockbot.addresses import IPNetwork, within
from rockbot.contracts import agent_config as cfg
from rockbot.contracts.builtin_tools import enabled_builtin_tools
from rockbot.contracts.tool_names import ToolRank, clash_warning
from rockbot.operator.validation import PRIVATE_NETWORKS_SETTING, parse_tool, tool_problems
from rockbot.resources import Agent, Tool
from rockbot.resources.agent import LabelSelector, ResolvedToolStatus
from rockbot.resources.common import SecretKeyRef
from rockbot.resources.tool import McpBackendSpec

#: A sub-agent runs a whole tool loop of its own: it gets as long as a scheduled run does by default.
SUBAGENT_TIMEOUT_SECONDS = 600.0
SUBAGENT_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {"message": {"type": "string", "description": "What to ask the agent, with all needed context."}},
    "required": ["message"],
}


@dataclass
class SecretEnv:
    """One environment variable of the agent pod filled from a Secret key."""

    env: str
    ref: SecretKeyRef


@dataclass
class Resolution:
    config: cfg.AgentConfig
    tools: list[ResolvedToolStatus]
    #: Tool problems: missing, not accepted, duplicate names, missing Secrets. Empty when all resolved.
    tool_problems: list[str]
    #: Problems that stop the agent from working at all (its model key, its bus Secret).
    blocking_problems: list[str]
    secret_env: list[SecretEnv] = field(default_factory=list)
    used_tools: list[str] = field(default_factory=list)


def secret_env_name(ref: SecretKeyRef) -> str:
    """A stable, collision-free environment variable name for a Secret key."""
    readable = re.sub(r"[^A-Z0-9]+", "_", f"{ref.name}_{ref.key}".upper()).strip("_")[:40]
    digest = hashlib.sha256(f"{ref.name}/{ref.key}".encode()).hexdigest()[:8].upper()
    return f"ROCKBOT_SECRET_{readable}_{digest}"


def selector_matches(selector: LabelSelector, labels: Mapping[str, str]) -> bool:
    if any(labels.get(key) != value for key, value in selector.match_labels.items()):
        return False
    for requirement in selector.match_expressions:
        present = requirement.key in labels
        value = labels.get(requirement.key)
        if requirement.operator == "In" and value not in requirement.values:
            return False
        if requirement.operator == "NotIn" and present and value in requirement.values:
            return False
        if requirement.operator == "Exists" and not present:
            return False
        if requirement.operator == "DoesNotExist" and present:
            return False
    return True


def wanted_tools(agent: Agent, tools: Iterable[dict[str, Any]]) -> list[str]:
    """Names of the existing Tools an Agent asks for, by name (in its order) then by selector (sorted)."""
    by_name = {tool["metadata"]["name"]: tool for tool in tools}
    wanted = [name for name in agent.spec.tools if name in by_name]  # a set: the schema refuses repeats
    if agent.spec.tool_selector is not None:
        for name, tool in sorted(by_name.items()):
            labels = tool["metadata"].get("labels") or {}
            if name not in wanted and selector_matches(agent.spec.tool_selector, labels):
                wanted.append(name)
    return wanted


def agents_using(tool_name: str, *, tools: Iterable[dict[str, Any]], agents: Iterable[dict[str, Any]]) -> list[str]:
    """Names of the Agents that ask for a Tool (what the Tool's status calls `usedBy`)."""
    tools = list(tools)
    users = []
    for body in agents:
        agent = Agent.model_validate({"metadata": body["metadata"], "spec": body.get("spec", {})})
        if tool_name in wanted_tools(agent, tools):
            users.append(body["metadata"]["name"])
    return sorted(users)


def resolve_agent(
    *,
    agent: Agent,
    tools: list[dict[str, Any]],
    agents: Mapping[str, dict[str, Any]],
    secret_keys: Mapping[str, set[str]],
    bus_secret: SecretKeyRef | None,
    http_token_secret: SecretKeyRef,
    default_runs: cfg.RunPolicy | None = None,
    private_networks: Sequence[IPNetwork] | None = None,
) -> Resolution:
    """Decide the agent's config and status from what exists in its namespace.

    `secret_keys` maps each Secret that exists in the namespace (of those referenced) to its key names;
    `bus_secret` holds the agent's own broker login (None: the agent gets no bus); `default_runs` is what the
    run store keeps of an Agent whose `spec.runs` says nothing (the chart's `runStore.defaults`);
    `private_networks` the non-public networks a cluster administrator opened to Tools and Agents (the chart's
    `agents.privateNetworks`; None: no such limit, as in `rockbot local`).
    """
    name, namespace = agent.metadata["name"], agent.metadata["namespace"]
    spec = agent.spec
    problems: list[str] = []
    blocking: list[str] = []
    secrets = _SecretWiring(namespace=namespace, secret_keys=secret_keys)

    api_key = None
    if spec.model.api_key_secret_ref is not None:
        # Wired even while missing: the pod starts by itself once the Secret appears.
        api_key = secrets.wire(spec.model.api_key_secret_ref, env=cfg.MODEL_API_KEY_ENV, required=False)
        if not secrets.exists(spec.model.api_key_secret_ref):
            blocking.append(secrets.problem(spec.model.api_key_secret_ref, field="spec.model.apiKeySecretRef"))
    if bus_secret is not None:
        secrets.wire(bus_secret, env=cfg.AMQP_URL_ENV, required=False)
    if bus_secret is not None and not secrets.exists(bus_secret):
        blocking.append(
            f'the bus Secret "{bus_secret.name}" (key {bus_secret.key!r}) is missing in namespace {namespace}: '
            "the operator makes it for the Agent; delete a Secret of that name without the key and it is made anew"
        )

    by_name = {tool["metadata"]["name"]: tool for tool in tools}
    wanted = wanted_tools(agent, tools)
    for tool_name in spec.tools:
        if tool_name not in by_name:
            problems.append(
                f'Tool "{tool_name}" not found in namespace {namespace}: create it or remove it from spec.tools'
            )

    candidates: list[cfg.ResolvedTool] = []
    servers: dict[str, tuple[str, cfg.McpServer]] = {}  # one connection per server name: the first Tool's
    for tool_name in wanted:
        body = by_name[tool_name]
        tool_issues = tool_problems(body, private_networks=private_networks)
        if tool_issues:
            problems.append(f'Tool "{tool_name}" is not accepted: {tool_issues[0]}')
            continue
        resolved, issue = _resolve_tool(parse_tool(body), agents=agents, own_name=name, secrets=secrets)
        if issue is None and resolved is not None and isinstance(resolved.backend, cfg.McpBackend):
            connection = resolved.backend.connection()
            first, seen = servers.setdefault(connection.server, (tool_name, connection))
            if seen != connection:
                issue = (
                    f'Tool "{tool_name}" names MCP server {connection.server!r} with another url, command or '
                    f'credentials than Tool "{first}": give one of them another spec.mcp.server'
                )
        if issue:
            problems.append(issue)
        elif resolved is not None:
            candidates.append(resolved)

    sub_agents, sub_agent_problems = _resolve_sub_agents(agent, agents=agents)
    candidates += sub_agents
    problems += sub_agent_problems
    web_search = _resolve_web_search(agent, secrets=secrets, problems=problems)
    long_term_memory = _resolve_long_term_memory(agent, model_key=api_key, secrets=secrets, problems=problems)

    blacklist = set(spec.tool_blacklist)
    probe = cfg.AgentConfig(
        name=name,
        namespace=namespace,
        model=cfg.ModelConfig(base_url=spec.model.base_url, name=spec.model.name),
        tools=candidates,
        builtin_tools=list(dict.fromkeys(spec.builtin_tools)),
        web_search=web_search,
        long_term_memory=long_term_memory,
    )
    builtins = [tool for tool in enabled_builtin_tools(probe) if tool.name not in blacklist]
    # One rule for clashes (rockbot.contracts.tool_names): built-ins first, then declared tools in order.
    holders = {tool.name: f"builtin:{tool.tool_set}" for tool in builtins}
    offered = []
    for tool in candidates:
        if tool.name in blacklist:
            continue
        if not _lists_a_server(tool):  # a `tool: "*"` Tool claims no name of its own
            if tool.name in holders:
                problems.append(
                    clash_warning(
                        name=tool.name, kept=holders[tool.name], dropped=tool.source, dropped_rank=ToolRank.DECLARED
                    )
                )
                continue
            holders[tool.name] = tool.source
        offered.append(tool)
    catalog = _mcp_catalog(spec.builtin_tools, tools=tools, declared=offered, secrets=secrets, problems=problems,
                           private_networks=private_networks)

    http_token = secrets.wire(http_token_secret, env=cfg.HTTP_TOKEN_ENV, required=False)
    config = cfg.AgentConfig(
        name=name,
        namespace=namespace,
        model=cfg.ModelConfig(
            base_url=spec.model.base_url,
            name=spec.model.name,
            api_key=api_key,
            temperature=spec.model.temperature,
            max_result_chars=spec.model.max_result_chars,
            request_timeout_seconds=spec.model.request_timeout_seconds,
        ),
        description=spec.description or "",
        system_prompt=spec.system_prompt,
        tools=offered,
        builtin_tools=probe.builtin_tools,
        tool_blacklist=sorted(blacklist),
        parallel_tool_calls=spec.parallel_tool_calls,
        max_iterations=spec.max_iterations,
        script_limits=cfg.ScriptLimits(**spec.script_limits.model_dump(),
                                         sessions=cfg.ScriptSessions(**spec.script_sessions.model_dump())),
        limits=cfg.Limits(tokens_per_day=spec.limits.tokens_per_day if spec.limits else None),
        runs=cfg.RunPolicy(**spec.runs.model_dump()) if spec.runs else (default_runs or cfg.RunPolicy()),
        long_term_memory=long_term_memory,
        web_search=web_search,
        web_browse=_resolve_web_browse(agent, private_networks=private_networks, problems=problems),
        private_networks=None if private_networks is None else list(private_networks),
        http_token=http_token,
        mcp_catalog=catalog,
        approvals=_approvals(agent),
    )
    statuses = [
        ResolvedToolStatus(name=tool.name, source=f"builtin:{tool.tool_set}", description=tool.description)
        for tool in builtins
    ] + [
        ResolvedToolStatus(
            name=f"{tool.backend.server}/*" if _lists_a_server(tool) else tool.name,  # type: ignore[union-attr]
            source=tool.source,
            description=tool.definition.function.description,
        )
        for tool in offered
    ]
    return Resolution(
        config=config,
        tools=statuses,
        tool_problems=problems,
        blocking_problems=blocking,
        secret_env=secrets.env,
        used_tools=sorted(wanted),
    )


def _resolve_sub_agents(
    agent: Agent, *, agents: Mapping[str, dict[str, Any]]
) -> tuple[list[cfg.ResolvedTool], list[str]]:
    """Other Agents offered as tools: their final answer is the tool result."""
    name, namespace = agent.metadata["name"], agent.metadata["namespace"]
    tools, problems = [], []
    for ref in agent.spec.sub_agents:
        if ref.name == name:
            problems.append(f'spec.subAgents: "{name}" cannot be its own sub-agent: remove it')
            continue
        target = agents.get(ref.name)
        if target is None:
            problems.append(f'sub-agent "{ref.name}" not found in namespace {namespace}: create it or remove it')
            continue
        description = ref.description or (target.get("spec") or {}).get("description") or f"Ask the {ref.name} agent."
        function = cfg.FunctionDefinition(
            name=ref.tool_name or ref.name, description=description, parameters=SUBAGENT_PARAMETERS
        )
        tools.append(
            cfg.ResolvedTool(
                definition=cfg.ToolDefinition(function=function),
                source=f"agent:{ref.name}",
                backend=cfg.AgentBackend(namespace=namespace, name=ref.name),
                timeout_seconds=SUBAGENT_TIMEOUT_SECONDS,
            )
        )
    return tools, problems


def _resolve_web_search(agent: Agent, *, secrets: _SecretWiring, problems: list[str]) -> cfg.WebSearchConfig | None:
    """The search provider, or None (then `web_search` is simply not offered)."""
    search = agent.spec.web_search
    if search is None:
        return None
    api_key = None
    if search.api_key_secret_ref is not None:
        api_key = secrets.wire(search.api_key_secret_ref, env=cfg.WEB_SEARCH_API_KEY_ENV)
        if api_key is None:
            problems.append(secrets.problem(search.api_key_secret_ref, field="spec.webSearch.apiKeySecretRef"))
            return None
    return cfg.WebSearchConfig(provider=search.provider, url=search.url, api_key=api_key)


def _resolve_long_term_memory(
    agent: Agent, *, model_key: cfg.SecretEnv | None, secrets: _SecretWiring, problems: list[str]
) -> cfg.LongTermMemoryConfig | None:
    """Long-term memory when enabled (its embeddings endpoint by default the model's, with the model's key), or None
    (remember, recall and forget are then not offered)."""
    memory = agent.spec.memory.long_term if agent.spec.memory else None
    if memory is None or not memory.enabled or memory.embeddings is None:
        return None
    embeddings = memory.embeddings
    api_key = model_key if embeddings.base_url is None else None
    if embeddings.api_key_secret_ref is not None:
        api_key = secrets.wire(embeddings.api_key_secret_ref, env=cfg.EMBEDDINGS_API_KEY_ENV)
        if api_key is None:
            problems.append(secrets.problem(embeddings.api_key_secret_ref,
                                            field="spec.memory.longTerm.embeddings.apiKeySecretRef"))  # fmt: skip
            return None
    recall = memory.auto_recall
    return cfg.LongTermMemoryConfig(
        scope=memory.scope, retention_days=memory.retention_days, max_items_per_scope=memory.max_items_per_scope,
        max_bytes_per_scope=memory.max_bytes_per_scope,
        embeddings=cfg.EmbeddingsConfig(base_url=embeddings.base_url or agent.spec.model.base_url,
                                        model=embeddings.model, api_key=api_key,
                                        timeout_seconds=embeddings.timeout_seconds),
        auto_recall=cfg.AutoRecallConfig(**recall.model_dump()) if recall else None,
    )  # fmt: skip


def _resolve_web_browse(agent: Agent, *, private_networks: Sequence[IPNetwork] | None,
                        problems: list[str]) -> cfg.WebBrowseConfig:
    """Where web_browse may go beyond public addresses; a network that does not parse, or one not within what a
    cluster administrator opened (`private_networks`), is left out and named (the schema's pattern cannot tell
    10.0.0.300/8 or 10.0.0.1/8 from a network), so one entry never fails the whole reconcile."""
    browse = agent.spec.web_browse
    if browse is None:
        return cfg.WebBrowseConfig()
    networks = []
    for index, text in enumerate(browse.allowed_networks):
        try:
            network = ipaddress.ip_network(text)
        except ValueError as error:
            problems.append(f"spec.webBrowse.allowedNetworks[{index}]: {text!r} is not a network ({error}): "
                            f"{_cidr_fix(text)}; web_browse is given the others")
            continue
        if private_networks is not None and not within(network, private_networks):
            problems.append(f"spec.webBrowse.allowedNetworks[{index}]: {text} is not within the non-public networks "
                            f"a cluster administrator opened to agents: ask them to add it to "
                            f"{PRIVATE_NETWORKS_SETTING}, or remove it (web_browse reaches public addresses without "
                            "it, and is given the others)")
            continue
        networks.append(network)
    github = {"github_api_url": browse.github_api_url} if browse.github_api_url else {}
    return cfg.WebBrowseConfig(allowed_networks=networks, **github)


def _cidr_fix(text: str) -> str:
    try:
        return f"write {ipaddress.ip_network(text, strict=False)}"
    except ValueError:
        return "write an address and prefix length, e.g. 10.20.0.0/16"


class _SecretWiring:
    """Collects the Secret keys the pod needs as env vars, and words the problem when one is missing."""

    def __init__(self, *, namespace: str, secret_keys: Mapping[str, set[str]]) -> None:
        self._namespace = namespace
        self._secret_keys = secret_keys
        self._wired: dict[str, SecretEnv] = {}

    @property
    def env(self) -> list[SecretEnv]:
        return sorted(self._wired.values(), key=lambda item: item.env)

    def wire(self, ref: SecretKeyRef, *, env: str | None = None, required: bool = True) -> cfg.SecretEnv | None:
        """The env var that will carry this Secret key, or None when the key does not exist (yet)."""
        if required and not self.exists(ref):
            return None
        name = env or secret_env_name(ref)
        self._wired[name] = SecretEnv(env=name, ref=ref)
        return cfg.SecretEnv(env=name)

    def exists(self, ref: SecretKeyRef) -> bool:
        return ref.key in self._secret_keys.get(ref.name, set())

    def problem(self, ref: SecretKeyRef, *, field: str) -> str:
        if ref.name not in self._secret_keys:
            return (
                f'{field}: Secret "{ref.name}" not found in namespace {self._namespace}: create it with key {ref.key!r}'
            )
        return f'{field}: Secret "{ref.name}" has no key {ref.key!r}: add the key or fix {field}.key'


def _resolve_tool(
    tool: Tool, *, agents: Mapping[str, Any], own_name: str, secrets: _SecretWiring
) -> tuple[cfg.ResolvedTool | None, str | None]:
    spec = tool.spec
    name = tool.metadata["name"]
    backend: cfg.Backend
    if spec.rest is not None:
        auth = None
        if spec.rest.auth is not None:
            value = secrets.wire(spec.rest.auth.secret_ref)
            if value is None:
                problem = secrets.problem(spec.rest.auth.secret_ref, field="spec.rest.auth.secretRef")
                return None, f'Tool "{name}": {problem}'
            auth = cfg.RestAuth(
                type=spec.rest.auth.type, header_name=spec.rest.auth.header_name or "Authorization", value=value
            )
        backend = cfg.RestBackend(url=spec.rest.url, method=spec.rest.method, headers=spec.rest.headers, auth=auth)
    elif spec.mcp is not None:
        server, problem = _mcp_server(spec.mcp, secrets=secrets)
        if server is None:
            return None, f'Tool "{name}": {problem}'
        backend = cfg.McpBackend(**server.model_dump(), tool=spec.mcp.tool)
    elif spec.script is not None:
        backend = cfg.ScriptBackend(source=spec.script.source, pip_packages=spec.script.pip_packages)
    elif spec.a2a is not None:
        token = None
        if spec.a2a.token_secret_ref is not None:
            token = secrets.wire(spec.a2a.token_secret_ref)
            if token is None:
                problem = secrets.problem(spec.a2a.token_secret_ref, field="spec.a2a.tokenSecretRef")
                return None, f'Tool "{name}": {problem}'
        backend = cfg.A2ABackend(url=spec.a2a.url, token=token)
    else:
        assert spec.agent is not None
        if spec.agent.name == own_name:
            return None, f'Tool "{name}" delegates to this agent itself: point spec.agent.name at another Agent'
        if spec.agent.name not in agents:
            return None, f'Tool "{name}": agent "{spec.agent.name}" not found: create it or fix spec.agent.name'
        backend = cfg.AgentBackend(namespace=tool.metadata["namespace"], name=spec.agent.name)
    source = f"mcp:{spec.mcp.server}" if spec.mcp is not None else f"tool:{name}"
    parameters = spec.parameters
    if (spec.agent is not None or spec.a2a is not None) and not parameters.get("properties"):
        parameters = SUBAGENT_PARAMETERS  # what the callee needs; a Tool's own parameters are sent as JSON instead
    definition = cfg.ToolDefinition(
        function=cfg.FunctionDefinition(name=tool.function_name, description=spec.description, parameters=parameters)
    )
    approval = None
    if spec.approval is not None and spec.approval.required:
        approval = cfg.ApprovalPolicy(timeout_seconds=float(spec.approval.timeout_seconds),
                                      on_timeout=spec.approval.on_timeout)
    return cfg.ResolvedTool(
        definition=definition, source=source, backend=backend, timeout_seconds=float(spec.timeout_seconds),
        approval=approval,
    ), None


def _approvals(agent: Agent) -> dict[str, cfg.ApprovalPolicy]:
    """The Agent's own list of tools (built-in or MCP, by name) whose calls wait for a person."""
    wanted = agent.spec.approval
    if wanted is None:
        return {}
    policy = cfg.ApprovalPolicy(timeout_seconds=float(wanted.timeout_seconds), on_timeout=wanted.on_timeout)
    return dict.fromkeys(wanted.tools, policy)


def _lists_a_server(tool: cfg.ResolvedTool) -> bool:
    """A Tool with `tool: "*"`: the agent offers whatever its server lists, under the server's names."""
    return isinstance(tool.backend, cfg.McpBackend) and tool.backend.tool == "*"


def _mcp_server(spec: McpBackendSpec, *, secrets: _SecretWiring) -> tuple[cfg.McpServer | None, str | None]:
    """The connection to an MCP server with its Secret-backed headers or environment wired into the pod."""
    headers: dict[str, cfg.SecretHeader] = {}
    env: dict[str, cfg.SecretEnv] = {}
    for index, header in enumerate(spec.headers_from):
        wired = secrets.wire(header.secret_key_ref)
        if wired is None:
            return None, secrets.problem(header.secret_key_ref, field=f"spec.mcp.headersFrom[{index}].secretKeyRef")
        headers[header.name] = cfg.SecretHeader(env=wired.env, prefix=header.prefix or "")
    for index, variable in enumerate(spec.env_from):
        wired = secrets.wire(variable.secret_key_ref)
        if wired is None:
            return None, secrets.problem(variable.secret_key_ref, field=f"spec.mcp.envFrom[{index}].secretKeyRef")
        env[variable.name] = wired
    server = cfg.McpServer(
        server=spec.server, url=spec.url, transport=spec.transport, command=spec.command, headers=headers, env=env
    )
    return server, None


def _mcp_catalog(
    builtin_sets: list[str],
    *,
    tools: list[dict[str, Any]],
    declared: list[cfg.ResolvedTool],
    secrets: _SecretWiring,
    problems: list[str],
    private_networks: Sequence[IPNetwork] | None,
) -> list[cfg.McpServer]:
    """The namespace's other MCP servers, which the `mcp` set lets the model attach by name, and nothing else:
    a server is only ever one an accepted Tool declares, never a URL or command the model wrote."""
    if "mcp" not in builtin_sets:
        return []
    taken = {tool.backend.server for tool in declared if isinstance(tool.backend, cfg.McpBackend)}
    catalog: dict[str, cfg.McpServer] = {}
    for body in sorted(tools, key=lambda tool: tool["metadata"]["name"]):
        mcp = (body.get("spec") or {}).get("mcp")
        if not mcp or mcp.get("server") in taken or mcp.get("server") in catalog or tool_problems(
                body, private_networks=private_networks):
            continue
        spec = parse_tool(body).spec.mcp
        assert spec is not None
        server, problem = _mcp_server(spec, secrets=secrets)
        if server is None:
            problems.append(f'MCP server {spec.server!r} (Tool "{body["metadata"]["name"]}") cannot be attached: '
                            f"{problem}")
            continue
        catalog[spec.server] = server
    return list(catalog.values())
