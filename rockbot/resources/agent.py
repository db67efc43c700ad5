"""The Agent resource: a model, a prompt and tools, reconciled into a Deployment that has no API rights."""

from __future__ import annotations

import datetime
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field

from rockbot.resources.common import (
    DNS_LABEL,
    MAX_APPROVAL_SECONDS,
    Condition,
    FunctionName,
    KubeName,
    ListSet,
    LocalObjectReference,
    OnApprovalTimeout,
    PrinterColumn,
    Quantity,
    Resource,
    Rule,
    Schema,
    SecretKeyRef,
    exactly_one,
    matches,
)

BuiltinToolSetName = Literal["scripts", "web", "scheduling", "memory", "subagents", "guides", "mcp"]

#: An Agent's children are named `rockbot-<agent><suffix>`, one suffix per child kind.
CHILD_PREFIX = "rockbot-"
CHILD_SUFFIXES = ("", "-config", "-http-token", "-bus")
#: The longest Agent name whose every child name still fits a DNS label (63 characters): 44.
MAX_AGENT_NAME = 63 - len(CHILD_PREFIX) - max(len(suffix) for suffix in CHILD_SUFFIXES)
#: An Agent's Ready=False reason when it has no replicas: nothing serves it or reads its inbox.
SCALED_TO_ZERO = "ScaledToZero"


class ModelSpec(Schema):
    """An OpenAI-compatible Chat Completions endpoint (OpenAI, OpenRouter, vLLM, Ollama, llama.cpp)."""

    rules = (
        Rule(
            cel="self.baseUrl.startsWith('http://') || self.baseUrl.startsWith('https://')",
            message="baseUrl must be an http:// or https:// URL, e.g. https://openrouter.ai/api/v1",
            holds=lambda m: m.base_url.startswith(("http://", "https://")),
        ),
        Rule(
            cel="!has(self.apiKey)",
            message="apiKey: a key is never written into an Agent: store it in a Secret and name it with "
            "apiKeySecretRef: {name: <secret>, key: <key>}",
            holds=lambda m: m.api_key is None,
        ),
    )

    base_url: Annotated[str, Field(min_length=1, max_length=2048, description="Base URL of the API, up to /v1.")]
    name: Annotated[str, Field(min_length=1, max_length=256, description="Model name, e.g. openai/gpt-4o-mini.")]
    api_key_secret_ref: SecretKeyRef | None = Field(
        default=None, description="Secret key holding the API key; omit for endpoints without auth."
    )
    api_key: Annotated[str, Field(max_length=4096)] | None = Field(
        default=None, description="Refused: declared only so that a literal key is rejected, not silently dropped."
    )
    temperature: Annotated[float, Field(ge=0, le=2)] | None = Field(
        default=None, description="Sampling temperature sent to the model; omit for the endpoint's default."
    )
    max_result_chars: Annotated[int, Field(ge=1000, le=1_000_000)] = Field(
        default=16_000, description="Tool results longer than this go to working memory in chunks."
    )
    request_timeout_seconds: Annotated[int, Field(ge=1, le=3600)] = Field(
        default=60, description="Longest wait for the model endpoint's next bytes; a timed-out request is tried "
        "once more, then the turn fails.",
    )


class LabelSelectorRequirement(Schema):
    rules = (
        Rule(
            cel="!(self.operator in ['In', 'NotIn']) || (has(self.values) && self.values.size() > 0)",
            message="values must list at least one label value when operator is In or NotIn",
            holds=lambda r: r.operator not in ("In", "NotIn") or len(r.values) > 0,
        ),
        Rule(
            cel="!(self.operator in ['Exists', 'DoesNotExist']) || !has(self.values) || self.values.size() == 0",
            message="values must be empty when operator is Exists or DoesNotExist: remove values",
            holds=lambda r: r.operator not in ("Exists", "DoesNotExist") or not r.values,
        ),
    )

    key: Annotated[str, Field(min_length=1, max_length=317)] = Field(
        description="The label key the requirement applies to."
    )
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"] = Field(
        description="How the label's value is compared with values."
    )
    values: Annotated[list[Annotated[str, Field(max_length=63)]], Field(max_length=64)] = Field(
        default_factory=list, description="Label values; empty for Exists and DoesNotExist."
    )


class LabelSelector(Schema):
    """Selects Tools in the Agent's namespace by label, like a Deployment selects pods."""

    match_labels: dict[str, str] = Field(
        default_factory=dict, description="Labels a Tool must carry, each with this value."
    )
    match_expressions: list[LabelSelectorRequirement] = Field(
        default_factory=list, description="Further requirements on a Tool's labels; all must hold."
    )


class SubAgentRef(Schema):
    """Another Agent in the same namespace, offered to the model as a tool."""

    name: KubeName = Field(description="The Agent, in this namespace; the model sees a tool of this name.")
    tool_name: FunctionName | None = Field(default=None, description="Tool name; defaults to the Agent's name.")
    description: Annotated[str, Field(max_length=2000)] | None = Field(
        default=None, description="What the model is told; defaults to the sub-agent's spec.description."
    )


class WebSearchSpec(Schema):
    rules = (
        Rule(
            cel="self.provider != 'searxng' || has(self.url)",
            message="a searxng provider needs url",
            holds=lambda w: w.provider != "searxng" or w.url is not None,
        ),
        Rule(
            cel="self.provider != 'brave' || has(self.apiKeySecretRef)",
            message="the brave provider needs apiKeySecretRef",
            holds=lambda w: w.provider != "brave" or w.api_key_secret_ref is not None,
        ),
    )

    provider: Literal["searxng", "brave"] = Field(
        description="searxng (an instance at url) or brave (Brave Search's API, its key in apiKeySecretRef)."
    )
    url: Annotated[str, Field(max_length=2048)] | None = Field(
        default=None, description="Base URL of the search engine (searxng)."
    )
    api_key_secret_ref: SecretKeyRef | None = Field(
        default=None, description="Secret key holding the search API's key (brave)."
    )


class WebBrowseSpec(Schema):
    """Where `web_browse` may connect besides the public internet (it refuses private addresses)."""

    rules = (
        Rule(
            cel="!has(self.githubApiUrl) || self.githubApiUrl.startsWith('http://') "
            "|| self.githubApiUrl.startsWith('https://')",
            message="githubApiUrl must be an http:// or https:// URL, e.g. https://api.github.com",
            holds=lambda w: w.github_api_url is None or w.github_api_url.startswith(("http://", "https://")),
        ),
    )

    allowed_networks: Annotated[
        list[Annotated[str, Field(pattern=r"^[0-9a-fA-F:.]+/[0-9]{1,3}$")]], Field(max_length=64)
    ] = Field(default_factory=list, description="CIDRs web_browse may reach although not public, e.g. 10.20.0.0/16.")
    github_api_url: Annotated[str, Field(max_length=2048)] | None = Field(
        default=None,
        description="GitHub issue and pull-request URLs are read through this REST API (default https://api.github.com).",
    )


class ScriptLimitsSpec(Schema):
    timeout_seconds: Annotated[int, Field(ge=1, le=3600)] = Field(
        default=30, description="Longest a script may run; then it is stopped and the call says so."
    )
    cpu: Quantity = Field(default="500m", description="CPU of a script's sandbox (a Kubernetes quantity).")
    memory: Quantity = Field(
        default="256Mi",
        description="Memory of a script's sandbox; a script over it is killed (OOM) and the call says so.",
    )


class ScriptSessionsSpec(Schema):
    """Whether a conversation's scripts share one sandbox, whose interpreter keeps its globals between calls."""

    rules = (
        Rule(
            cel="self.idleSeconds <= self.maxSeconds",
            message="idleSeconds must not be over maxSeconds: a session ends at maxSeconds whatever its use",
            holds=lambda m: m.idle_seconds <= m.max_seconds,
        ),
    )

    mode: Literal["PerCall", "PerConversation"] = Field(
        default="PerCall", description="PerCall: every script starts afresh; PerConversation: one sandbox per "
        "conversation (agent, caller, session) keeps variables and files between its calls.",
    )
    idle_seconds: Annotated[int, Field(ge=10, le=86_400)] = Field(
        default=300, description="A session unused this long is deleted (its variables and files with it)."
    )
    max_seconds: Annotated[int, Field(ge=10, le=86_400)] = Field(
        default=3600, description="A session is deleted this long after it started, however much it is used."
    )


class AgentLimitsSpec(Schema):
    """Spending limits of one Agent, over all its replicas."""

    tokens_per_day: Annotated[int, Field(ge=1)] | None = Field(
        default=None,
        description="Model tokens (prompt and completion) the Agent may use per UTC day; once they are used, "
        "turns are refused until midnight UTC. status.usage shows today's count.",
    )


class AgentRunsSpec(Schema):
    """What the run store keeps of this Agent's turns, and for how long."""

    record: Literal["Full", "Metadata", "None"] = Field(
        default="Full",
        description="Full: messages, tool arguments, results and script output (secrets redacted); Metadata: "
        "who, when, which tools and models, outcomes, tokens and durations, no text; None: nothing.",
    )
    retention_days: Annotated[int, Field(ge=1, le=3650)] = Field(
        default=30, description="Days a run is kept; older runs are deleted."
    )


class EmbeddingsSpec(Schema):
    """An OpenAI-compatible embeddings endpoint (`POST {baseUrl}/embeddings`): by default the Agent's model endpoint,
    with its key."""

    rules = (
        Rule(
            cel="!has(self.baseUrl) || self.baseUrl.startsWith('http://') || self.baseUrl.startsWith('https://')",
            message="baseUrl must be an http:// or https:// URL, e.g. https://api.openai.com/v1",
            holds=lambda e: e.base_url is None or e.base_url.startswith(("http://", "https://")),
        ),
    )

    model: Annotated[str, Field(min_length=1, max_length=256)] = Field(
        description="Embeddings model name, e.g. text-embedding-3-small."
    )
    base_url: Annotated[str, Field(min_length=1, max_length=2048)] | None = Field(
        default=None, description="Base URL of the API, up to /v1; omit for spec.model.baseUrl (and its key)."
    )
    api_key_secret_ref: SecretKeyRef | None = Field(
        default=None, description="Secret key holding the API key; omit for the model's key (or no auth)."
    )
    timeout_seconds: Annotated[int, Field(ge=1, le=60)] = Field(
        default=3, description="Longest wait for an embedding; past it recall finds nothing this turn, and says so."
    )


class AutoRecallSpec(Schema):
    """Before the model is asked, the caller's most relevant memories are put into the turn as a recall's result."""

    max_tokens: Annotated[int, Field(ge=50, le=4000)] = Field(
        default=400, description="The most tokens (about four characters each) the recalled notes take."
    )
    max_items: Annotated[int, Field(ge=1, le=20)] = Field(default=3, description="The most memories recalled.")
    min_score: Annotated[float, Field(ge=0, le=1)] = Field(
        default=0.3, description="Memories less similar than this (cosine, 0-1) are left out; tune it to the model."
    )


class LongTermMemorySpec(Schema):
    """What the agent remembers across conversations (remember, recall, forget), kept in the run store's database."""

    rules = (
        Rule(
            cel="!self.enabled || has(self.embeddings)",
            message="embeddings: long-term memory needs an embeddings model: embeddings: {model: "
            "text-embedding-3-small} (baseUrl and apiKeySecretRef default to spec.model's)",
            holds=lambda m: not m.enabled or m.embeddings is not None,
        ),
    )

    enabled: bool = Field(default=False, description="Turn long-term memory on (it needs embeddings).")
    scope: Literal["Caller", "Agent"] = Field(
        default="Caller", description="Caller: each caller has a memory of their own; Agent: one memory every caller "
        "of this Agent shares.",
    )
    retention_days: Annotated[int, Field(ge=1, le=3650)] = Field(
        default=365, description="Days a memory is kept; then it is deleted."
    )
    max_items_per_scope: Annotated[int, Field(ge=1, le=100_000)] = Field(
        default=1000, description="The most memories one scope keeps; remember is refused past it."
    )
    max_bytes_per_scope: Annotated[int, Field(ge=1000, le=100_000_000)] = Field(
        default=1_000_000, description="The most bytes of memory text one scope keeps; remember is refused past it."
    )
    embeddings: EmbeddingsSpec | None = None
    auto_recall: AutoRecallSpec | None = Field(
        default=None, description="Put the caller's most relevant memories into each turn; omit to leave it to recall."
    )


class AgentMemorySpec(Schema):
    long_term: LongTermMemorySpec | None = None


class ResourceRequirements(Schema):
    requests: dict[str, Quantity] = Field(
        default_factory=dict, description="Resources the container is scheduled with (cpu, memory)."
    )
    limits: dict[str, Quantity] = Field(
        default_factory=dict, description="The most the container may use (cpu, memory)."
    )


class KeySelector(Schema):
    """A key of a Secret or ConfigMap in the Agent's namespace."""

    name: KubeName = Field(description="Name of the Secret or ConfigMap, in the Agent's namespace.")
    key: Annotated[str, Field(min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$")] = Field(
        description="Key whose value is used."
    )
    optional: bool | None = Field(default=None, description="Whether the pod starts when the key is missing.")


class ObjectFieldSelector(Schema):
    field_path: Annotated[str, Field(min_length=1, max_length=256)] = Field(
        description="A field of the pod, e.g. metadata.name or status.podIP."
    )
    api_version: Annotated[str, Field(max_length=64)] | None = Field(
        default=None, description="Version of the schema fieldPath is written in (v1)."
    )


class ResourceFieldSelector(Schema):
    resource: Annotated[str, Field(min_length=1, max_length=64)] = Field(
        description="A container resource, e.g. limits.memory or requests.cpu."
    )
    container_name: Annotated[str, Field(max_length=63)] | None = Field(
        default=None, description="The container whose resource is read; the agent's own by default."
    )
    divisor: Quantity | None = Field(default=None, description="The unit the value is given in, e.g. 1Mi.")


class EnvVarSource(Schema):
    """The Pod's EnvVarSource: exactly one source."""

    rules = (
        Rule(
            cel="[has(self.secretKeyRef), has(self.configMapKeyRef), has(self.fieldRef), has(self.resourceFieldRef)]"
            ".filter(x, x).size() == 1",
            message="valueFrom must set exactly one of secretKeyRef, configMapKeyRef, fieldRef or resourceFieldRef",
            holds=lambda v: exactly_one(v.secret_key_ref, v.config_map_key_ref, v.field_ref, v.resource_field_ref),
        ),
    )

    secret_key_ref: KeySelector | None = None
    config_map_key_ref: KeySelector | None = None
    field_ref: ObjectFieldSelector | None = Field(default=None, description="A field of the pod, e.g. metadata.name.")
    resource_field_ref: ResourceFieldSelector | None = Field(
        default=None, description="A resource of a container, e.g. limits.memory."
    )


class EnvVar(Schema):
    """An extra environment variable; `valueFrom` takes the same shape as in a Pod."""

    rules = (
        Rule(
            cel="!self.name.startsWith('ROCKBOT_')",
            message="env names starting with ROCKBOT_ are reserved for the operator",
            holds=lambda e: not e.name.startswith("ROCKBOT_"),
        ),
        Rule(
            cel="!(has(self.value) && has(self.valueFrom))",
            message="set either value or valueFrom, not both",
            holds=lambda e: e.value is None or e.value_from is None,
        ),
    )

    name: Annotated[str, Field(pattern=r"^[-._a-zA-Z][-._a-zA-Z0-9]*$", max_length=256)] = Field(
        description="The variable's name (ROCKBOT_* is reserved)."
    )
    value: str | None = Field(default=None, description="A literal value.")
    value_from: EnvVarSource | None = None


class AgentApprovalSpec(Schema):
    """Built-in or MCP tools of this Agent (by the name the model sees) whose calls wait for a person."""

    tools: Annotated[list[FunctionName], Field(max_length=256), ListSet()] = Field(
        default_factory=list, description="Tool names, e.g. execute_python_script."
    )
    timeout_seconds: Annotated[int, Field(ge=1, le=MAX_APPROVAL_SECONDS)] = Field(
        default=600, description="How long a call waits for a decision."
    )
    on_timeout: OnApprovalTimeout = Field(
        default="Deny", description="What a call nobody decided on in time becomes: Deny (a tool error) or Allow."
    )


class AgentSpec(Schema):
    rules = (
        Rule(
            cel="!has(self.toolBlacklist) || !has(self.tools) "
            "|| self.toolBlacklist.all(n, !self.tools.exists(t, t == n))",
            message="a tool cannot be both listed in tools and blacklisted; remove it from one of them",
            holds=lambda a: not set(a.tool_blacklist) & set(a.tools),
        ),
    )

    description: Annotated[str, Field(max_length=2000)] = Field(
        default="", description="What this agent does; shown to other agents that use it as a sub-agent."
    )
    model: ModelSpec
    system_prompt: Annotated[str, Field(max_length=100_000)] = Field(
        default="", description="Instructions put before every conversation."
    )
    tools: Annotated[list[KubeName], Field(max_length=128), ListSet()] = Field(
        default_factory=list, description="Tool resources in this namespace, by name."
    )
    tool_selector: LabelSelector | None = Field(default=None, description="Tool resources selected by label.")
    sub_agents: Annotated[list[SubAgentRef], Field(max_length=32)] = Field(
        default_factory=list,
        description="Other Agents of this namespace the model may call, each offered as a tool of its name.",
    )
    tool_blacklist: Annotated[list[FunctionName], Field(max_length=256), ListSet()] = Field(
        default_factory=list, description="Tool names the model is never offered and that are refused if called."
    )
    builtin_tools: list[BuiltinToolSetName] = Field(
        default_factory=lambda: ["memory"], description="Built-in tool sets to enable."
    )
    web_search: WebSearchSpec | None = Field(
        default=None, description="The search engine behind the web set's web_search tool; omit for none."
    )
    web_browse: WebBrowseSpec | None = None
    parallel_tool_calls: bool = Field(
        default=True, description="Run the tool calls of one model answer at once (true) or one after another."
    )
    max_iterations: Annotated[int, Field(ge=1, le=100)] = Field(
        default=10, description="The most model requests one turn may make; then it ends with iteration_limit."
    )
    replicas: Annotated[int, Field(ge=0, le=20)] = Field(
        default=1, description="Pods of the agent's Deployment; 0 scales it to zero (not Ready)."
    )
    image: Annotated[str, Field(max_length=512)] | None = Field(
        default=None, description="Overrides the operator's default agent image."
    )
    resources: ResourceRequirements | None = Field(
        default=None, description="CPU and memory of the agent's container, as a Pod's resources."
    )
    env: Annotated[list[EnvVar], Field(max_length=64)] = Field(
        default_factory=list, description="Extra environment variables of the agent's container, as in a Pod."
    )
    script_limits: ScriptLimitsSpec = Field(
        default_factory=ScriptLimitsSpec,
        description="Limits of each script the agent runs in the sandbox; no request can raise them.",
    )
    script_sessions: ScriptSessionsSpec = Field(default_factory=ScriptSessionsSpec)
    limits: AgentLimitsSpec | None = None
    approval: AgentApprovalSpec | None = Field(default=None, description="Tools whose calls wait for a person.")
    runs: AgentRunsSpec | None = None
    memory: AgentMemorySpec | None = Field(default=None, description="Long-term memory (builtinTools' memory set "
                                           "is working memory: large tool results, for minutes).")


class ResolvedToolStatus(Schema):
    """One tool exactly as the model is offered it."""

    name: str
    source: str
    description: str = ""


class TokenUsageStatus(Schema):
    """The model tokens the Agent used in one UTC day, over all its replicas (as they reported them)."""

    day: datetime.date
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class AgentStatus(Schema):
    observed_generation: int | None = None
    conditions: list[Condition] = Field(default_factory=list)
    tools: list[ResolvedToolStatus] = Field(default_factory=list)
    tool_count: int | None = Field(default=None, description="How many tools the model is offered (len of tools).")
    replicas: int | None = None
    ready_replicas: int | None = None
    usage: TokenUsageStatus | None = Field(default=None, description="Today's token usage (UTC).")


class Agent(Resource):
    kind: ClassVar[str] = "Agent"
    plural: ClassVar[str] = "agents"
    short_names: ClassVar[list[str]] = ["ag"]
    printer_columns: ClassVar[list[PrinterColumn]] = [
        PrinterColumn(name="Ready", type="string", json_path='.status.conditions[?(@.type=="Ready")].status'),
        # Whether the egress canary found the Agent's pods held to their policy (empty with the canary off).
        PrinterColumn(name="Egress", type="string",
                      json_path='.status.conditions[?(@.type=="EgressRestricted")].status'),
        PrinterColumn(name="Model", type="string", json_path=".spec.model.name"),
        # A count: kubectl prints only the first value a column's path finds; the names are in status.tools.
        PrinterColumn(name="Tools", type="integer", json_path=".status.toolCount"),
        PrinterColumn(name="Age", type="date", json_path=".metadata.creationTimestamp"),
    ]
    rules = (
        Rule(
            cel=f"self.metadata.name.size() <= {MAX_AGENT_NAME}",
            message=f"metadata.name: Agent names are at most {MAX_AGENT_NAME} characters (children are named "
            f"{CHILD_PREFIX}<name>{max(CHILD_SUFFIXES, key=len)}, a 63-character DNS label): choose a shorter name",
            holds=lambda a: len(a.metadata.get("name", "")) <= MAX_AGENT_NAME,
        ),
        Rule(
            cel=f"self.metadata.name.matches('{DNS_LABEL}')",
            message="metadata.name: Agent names must be DNS labels (lowercase letters, digits and '-', no dots): "
            "their Service is named after them",
            holds=lambda a: matches(DNS_LABEL, a.metadata.get("name")),
        ),
    )

    api_version: str = "rockbot.dev/v1alpha1"
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: AgentSpec
    status: AgentStatus | None = None


__all__ = [
    "CHILD_PREFIX",
    "CHILD_SUFFIXES",
    "MAX_AGENT_NAME",
    "Agent",
    "AgentSpec",
    "AgentStatus",
    "LabelSelector",
    "LocalObjectReference",
    "ResolvedToolStatus",
    "TokenUsageStatus",
]
