"""The resolved agent configuration: rendered by the operator into a ConfigMap, read by the agent.

The operator resolves an Agent's references (Tools, sub-agents, Secrets, built-in tool sets) into
this one document so the agent process needs no Kubernetes API at all. Tool definitions are stored
in OpenAI function format, exactly as the model will see them.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, IPvAnyNetwork

SCHEMA_VERSION = 1

#: Environment variables through which secrets reach the agent pod (`valueFrom` Secret refs).
MODEL_API_KEY_ENV = "ROCKBOT_MODEL_API_KEY"
AMQP_URL_ENV = "ROCKBOT_AMQP_URL"
HTTP_TOKEN_ENV = "ROCKBOT_HTTP_TOKEN"
WEB_SEARCH_API_KEY_ENV = "ROCKBOT_WEB_SEARCH_API_KEY"
EMBEDDINGS_API_KEY_ENV = "ROCKBOT_EMBEDDINGS_API_KEY"

BuiltinToolSet = Literal["scripts", "web", "scheduling", "memory", "subagents", "guides", "mcp"]


class Contract(BaseModel):
    """Strict base: unknown fields are a bug in the sender, not something to ignore."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class FunctionDefinition(Contract):
    name: Annotated[str, Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")]
    description: str
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})


class ToolDefinition(Contract):
    """One tool in OpenAI's Chat Completions `tools` format."""

    type: Literal["function"] = "function"
    function: FunctionDefinition


class SecretEnv(Contract):
    """A secret value the agent reads from an environment variable the operator wired."""

    env: str


class RestAuth(Contract):
    type: Literal["bearer", "header"]
    header_name: str = "Authorization"
    value: SecretEnv


class RestBackend(Contract):
    kind: Literal["rest"] = "rest"
    url: str
    method: Literal["GET", "POST", "PUT", "PATCH", "DELETE"] = "GET"
    headers: dict[str, str] = Field(default_factory=dict)
    auth: RestAuth | None = None


class SecretHeader(Contract):
    """An HTTP header: `prefix` then the secret in environment variable `env`."""

    env: str
    prefix: str = ""


class McpServer(Contract):
    """How to reach one MCP server; its credentials (Secret-backed env vars) go to it and to no other."""

    server: str
    url: str | None = None
    transport: Literal["streamable-http", "sse", "stdio"] = "streamable-http"
    command: list[str] = Field(default_factory=list)
    headers: dict[str, SecretHeader] = Field(default_factory=dict)
    env: dict[str, SecretEnv] = Field(default_factory=dict)


class McpBackend(McpServer):
    kind: Literal["mcp"] = "mcp"
    tool: str

    def connection(self) -> McpServer:
        return McpServer(**{name: getattr(self, name) for name in McpServer.model_fields})


class ScriptBackend(Contract):
    kind: Literal["script"] = "script"
    source: str
    pip_packages: list[str] = Field(default_factory=list)


class AgentBackend(Contract):
    """Delegate to another Agent over the bus; its final answer is the tool result."""

    kind: Literal["agent"] = "agent"
    namespace: str
    name: str


class A2ABackend(Contract):
    """Ask a remote agent over A2A; its answer is the tool result."""

    kind: Literal["a2a"] = "a2a"
    url: str
    token: SecretEnv | None = None


Backend = Annotated[
    RestBackend | McpBackend | ScriptBackend | AgentBackend | A2ABackend, Field(discriminator="kind")
]


class ApprovalPolicy(Contract):
    """A call waits for a person's decision this long; then it is denied (a tool error) or allowed."""

    timeout_seconds: Annotated[float, Field(gt=0)] = 600.0
    on_timeout: Literal["Deny", "Allow"] = "Deny"


class ResolvedTool(Contract):
    """A declared tool (Tool resource or sub-agent) with everything needed to call it."""

    definition: ToolDefinition
    source: str  # "tool:<name>", "agent:<name>"
    backend: Backend
    timeout_seconds: float = 30.0
    #: Each call (each tool of the server, for a Tool naming `tool: "*"`) waits for a person's approval.
    approval: ApprovalPolicy | None = None

    @property
    def name(self) -> str:
        return self.definition.function.name


class ModelConfig(Contract):
    base_url: str
    name: str
    api_key: SecretEnv | None = None
    temperature: float | None = None
    max_result_chars: Annotated[int, Field(ge=1000, le=1_000_000)] = 16_000  # the Agent CRD's bounds
    request_timeout_seconds: Annotated[float, Field(gt=0)] = 60.0


class ScriptSessions(Contract):
    """The Agent's `spec.scriptSessions`: PerConversation keeps one sandbox per conversation between calls."""

    mode: Literal["PerCall", "PerConversation"] = "PerCall"
    idle_seconds: int = 300
    max_seconds: int = 3600


class ScriptLimits(Contract):
    """What the scripts-manager holds an Agent's scripts to (it looks them up by the validated sender)."""

    timeout_seconds: int = 30
    cpu: str = "500m"
    memory: str = "256Mi"
    sessions: ScriptSessions = ScriptSessions()


class Limits(Contract):
    #: Model tokens the Agent may use per UTC day over all its replicas (None: no budget).
    tokens_per_day: Annotated[int, Field(ge=1)] | None = None


class RunPolicy(Contract):
    """What the agent records of its turns in the run store (the Agent's `spec.runs`)."""

    record: Literal["Full", "Metadata", "None"] = "Full"
    retention_days: Annotated[int, Field(ge=1, le=3650)] = 30


class EmbeddingsConfig(Contract):
    """An OpenAI-compatible `/embeddings` endpoint."""

    base_url: str
    model: str
    api_key: SecretEnv | None = None
    timeout_seconds: Annotated[float, Field(gt=0)] = 3.0


class AutoRecallConfig(Contract):
    max_tokens: Annotated[int, Field(ge=1)] = 400
    max_items: Annotated[int, Field(ge=1, le=20)] = 3
    min_score: Annotated[float, Field(ge=0, le=1)] = 0.3


class LongTermMemoryConfig(Contract):
    """Long-term memory (the Agent's `spec.memory.longTerm`, enabled): kept by the console, embedded here."""

    scope: Literal["Caller", "Agent"] = "Caller"
    retention_days: Annotated[int, Field(ge=1, le=3650)] = 365
    max_items_per_scope: Annotated[int, Field(ge=1)] = 1000
    max_bytes_per_scope: Annotated[int, Field(ge=1)] = 1_000_000
    embeddings: EmbeddingsConfig
    auto_recall: AutoRecallConfig | None = None


class WebSearchConfig(Contract):
    provider: Literal["searxng", "brave"]
    url: str | None = None
    api_key: SecretEnv | None = None


class WebBrowseConfig(Contract):
    """Where `web_browse` may connect: public addresses only, unless a network is allowed here.

    The model chooses the URLs, so by default loopback, private (cluster), link-local (cloud
    metadata) and other non-public addresses are refused; list e.g. `10.20.0.0/16` for an intranet,
    or `0.0.0.0/0` and `::/0` to allow everything.
    """

    allowed_networks: list[IPvAnyNetwork] = Field(default_factory=list)
    #: Where GitHub issue and pull-request URLs are read instead of their HTML pages.
    github_api_url: str = "https://api.github.com"


class AgentConfig(Contract):
    """Everything the agent process needs, and nothing it could use to reach the Kubernetes API."""

    schema_version: Literal[1] = SCHEMA_VERSION
    name: str
    namespace: str
    model: ModelConfig
    #: What the Agent does, for those who call it (its A2A card).
    description: str = ""
    system_prompt: str = ""
    tools: list[ResolvedTool] = Field(default_factory=list)
    builtin_tools: list[BuiltinToolSet] = Field(default_factory=list)
    tool_blacklist: list[str] = Field(default_factory=list)
    parallel_tool_calls: bool = True
    max_iterations: Annotated[int, Field(ge=1, le=100)] = 10  # the Agent CRD's bounds
    script_limits: ScriptLimits = Field(default_factory=ScriptLimits)
    limits: Limits = Field(default_factory=Limits)
    runs: RunPolicy = Field(default_factory=RunPolicy)
    #: Long-term memory; None: the Agent has none (its remember, recall and forget are not offered).
    long_term_memory: LongTermMemoryConfig | None = None
    web_search: WebSearchConfig | None = None
    web_browse: WebBrowseConfig = Field(default_factory=WebBrowseConfig)
    #: The non-public networks REST Tools may connect to, as a cluster administrator opened them (the operator sets
    #: it from the chart's `agents.privateNetworks`); None: any address (`rockbot local`: the person running it).
    private_networks: list[IPvAnyNetwork] | None = None
    http_token: SecretEnv | None = None
    #: MCP servers declared in the namespace that `mcp_register_server` may attach (the `mcp` set only).
    mcp_catalog: list[McpServer] = Field(default_factory=list)
    #: Built-in or MCP tools, by the name the model sees, whose calls wait for a person (the Agent's spec.approval).
    approvals: dict[str, ApprovalPolicy] = Field(default_factory=dict)
