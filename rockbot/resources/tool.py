"""The Tool resource: one function the model can call, with exactly one backend that runs it."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field

from rockbot.resources.common import (
    FUNCTION_NAME,
    MAX_APPROVAL_SECONDS,
    Condition,
    FunctionName,
    KubeName,
    OnApprovalTimeout,
    PrinterColumn,
    Resource,
    Rule,
    Schema,
    SecretKeyRef,
    exactly_one,
    matches,
)


class RestAuthSpec(Schema):
    rules = (
        Rule(
            cel="self.type != 'header' || has(self.headerName)",
            message="auth type header needs headerName, e.g. X-Api-Key",
            holds=lambda a: a.type != "header" or a.header_name is not None,
        ),
    )

    type: Literal["bearer", "header"] = Field(
        description="bearer (Authorization: Bearer <key>) or header (the key in headerName)."
    )
    header_name: Annotated[str, Field(pattern=r"^[A-Za-z0-9-]{1,128}$")] | None = Field(
        default=None, description="The header that carries the key when type is header."
    )
    secret_ref: SecretKeyRef


#: A REST or A2A backend's `url` is an http:// or https:// URL.
URL_IS_HTTP = Rule(
    cel="self.url.startsWith('http://') || self.url.startsWith('https://')",
    message="url must start with http:// or https://",
    holds=lambda backend: backend.url.startswith(("http://", "https://")),
)


class RestBackendSpec(Schema):
    """An HTTP call: `{arg}` placeholders in the URL are filled (escaped) from the call's arguments."""

    rules = (URL_IS_HTTP,)

    url: Annotated[str, Field(min_length=1, max_length=4096)] = Field(
        description="The URL called; {arg} placeholders are filled, escaped, from the call's arguments."
    )
    method: Literal["GET", "POST", "PUT", "PATCH", "DELETE"] = Field(default="GET", description="The HTTP method.")
    headers: Annotated[dict[str, Annotated[str, Field(max_length=8192)]], Field(max_length=64)] = Field(
        default_factory=dict,
        description="Literal headers sent with every call (secrets go in auth, never here).",
    )
    auth: RestAuthSpec | None = Field(default=None, description="How a call authenticates, with a key from a Secret.")


class SecretHeaderSpec(Schema):
    """An HTTP header whose value comes from a Secret key (after an optional prefix such as `Bearer `)."""

    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9-]{1,128}$")] = Field(description="The header's name.")
    prefix: Annotated[str, Field(max_length=64)] | None = Field(default=None, description="e.g. 'Bearer '.")
    secret_key_ref: SecretKeyRef


class SecretEnvSpec(Schema):
    """An environment variable whose value comes from a Secret key."""

    name: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", max_length=256)] = Field(
        description="The variable's name."
    )
    secret_key_ref: SecretKeyRef


class McpBackendSpec(Schema):
    """One tool of an MCP server, reached over streamable HTTP, SSE, or stdio."""

    rules = (
        Rule(
            cel="self.transport == 'stdio' ? has(self.command) && size(self.command) > 0 : has(self.url)",
            message="stdio needs command; streamable-http and sse need url",
            holds=lambda m: len(m.command) > 0 if m.transport == "stdio" else m.url is not None,
        ),
        Rule(
            cel="self.transport != 'stdio' || !has(self.headersFrom) || size(self.headersFrom) == 0",
            message="headersFrom is for streamable-http and sse servers: give a stdio server envFrom instead",
            holds=lambda m: m.transport != "stdio" or not m.headers_from,
        ),
        Rule(
            cel="self.transport == 'stdio' || !has(self.envFrom) || size(self.envFrom) == 0",
            message="envFrom is for stdio servers: give a streamable-http or sse server headersFrom instead",
            holds=lambda m: m.transport == "stdio" or not m.env_from,
        ),
    )

    server: KubeName = Field(description="A short name for the server; tools are listed as mcp:<server>.")
    url: Annotated[str, Field(max_length=4096)] | None = Field(
        default=None, description="URL of the MCP server (transport streamable-http or sse)."
    )
    transport: Literal["streamable-http", "sse", "stdio"] = Field(
        default="streamable-http", description="streamable-http, sse, or stdio (command runs inside the agent's pod)."
    )
    command: Annotated[list[Annotated[str, Field(max_length=4096)]], Field(max_length=64)] = Field(
        default_factory=list,
        description="The command that starts a stdio server.",
    )
    tool: Annotated[str, Field(min_length=1, max_length=256)] = Field(
        description="The server's tool offered to the model, or * for all of them."
    )
    headers_from: Annotated[list[SecretHeaderSpec], Field(max_length=16)] = Field(
        default_factory=list, description="HTTP headers from Secrets, sent to this server only (never literals)."
    )
    env_from: Annotated[list[SecretEnvSpec], Field(max_length=32)] = Field(
        default_factory=list, description="Environment from Secrets for a stdio server, given to it only."
    )


class ScriptBackendSpec(Schema):
    """Python run in the sandbox; the call's arguments arrive as JSON on stdin."""

    rules = (
        Rule(
            cel="!has(self.pipPackages) || self.pipPackages.all(p, !p.contains('@'))",
            message="pipPackages: URL requirements (name @ url) are refused: scripts have no network, packages come "
            "from the scripts-manager's allowed list; name the package instead, e.g. numpy==2.1.0",
            holds=lambda s: not any("@" in package for package in s.pip_packages),
        ),
    )

    source: Annotated[str, Field(min_length=1, max_length=262_144)] = Field(
        description="Python run in the sandbox; the call's arguments arrive as JSON on stdin."
    )
    #: Item bounds keep the CEL rule's cost within the API server's budget (it estimates unbounded strings).
    pip_packages: Annotated[list[Annotated[str, Field(min_length=1, max_length=200)]], Field(max_length=32)] = Field(
        default_factory=list,
        description="Packages the script needs, each a requirement, e.g. pandas>=2 (docs/reference/configuration.md).",
    )


class AgentBackendSpec(Schema):
    """Delegate the call to another Agent in this namespace."""

    name: KubeName = Field(description="The Agent called, in this namespace.")


class A2ABackendSpec(Schema):
    """Another agent that speaks Agent2Agent (A2A), anywhere: each call is one message to it, its answer the result."""

    rules = (URL_IS_HTTP,)

    url: Annotated[str, Field(min_length=1, max_length=4096)] = Field(
        description="The agent's base URL, where /.well-known/agent-card.json is served."
    )
    token_secret_ref: SecretKeyRef | None = Field(
        default=None, description="Secret key holding the bearer token the agent expects; omit for none."
    )


class ApprovalSpec(Schema):
    """A person approves each call of this Tool before it runs (in the console, or `rockbot local`'s chat)."""

    required: bool = Field(default=True, description="Whether a call waits for a person's approval.")
    timeout_seconds: Annotated[int, Field(ge=1, le=MAX_APPROVAL_SECONDS)] = Field(
        default=600, description="How long a call waits for a decision."
    )
    on_timeout: OnApprovalTimeout = Field(
        default="Deny", description="What a call nobody decided on in time becomes: Deny (a tool error) or Allow."
    )


class ToolSpec(Schema):
    rules = (
        Rule(
            cel="[has(self.rest), has(self.mcp), has(self.script), has(self.agent), has(self.a2a)]"
            ".filter(x, x).size() == 1",
            message="a Tool has exactly one backend: set one of rest, mcp, script, agent or a2a",
            holds=lambda t: exactly_one(t.rest, t.mcp, t.script, t.agent, t.a2a),
        ),
    )

    function_name: FunctionName | None = Field(
        default=None, description="The name the model sees; defaults to metadata.name."
    )
    description: Annotated[str, Field(min_length=1, max_length=4000)] = Field(
        description="What the tool does, as the model reads it."
    )
    parameters: dict[str, Any] = Field(
        default_factory=lambda: {"type": "object", "properties": {}},
        description="JSON Schema of the arguments (an object schema).",
    )
    timeout_seconds: Annotated[int, Field(ge=1, le=3600)] = Field(
        default=30, description="Longest a call may take; then it is a tool error the model sees."
    )
    approval: ApprovalSpec | None = Field(default=None, description="Calls wait for a person's approval.")
    rest: RestBackendSpec | None = None
    mcp: McpBackendSpec | None = None
    script: ScriptBackendSpec | None = None
    agent: AgentBackendSpec | None = None
    a2a: A2ABackendSpec | None = Field(default=None, alias="a2a")  # not the camel-casing's `a2A`


class ToolStatus(Schema):
    observed_generation: int | None = None
    conditions: list[Condition] = Field(default_factory=list)
    used_by: list[str] = Field(default_factory=list)


class Tool(Resource):
    kind: ClassVar[str] = "Tool"
    plural: ClassVar[str] = "tools"
    short_names: ClassVar[list[str]] = ["tl"]
    printer_columns: ClassVar[list[PrinterColumn]] = [
        PrinterColumn(name="Accepted", type="string", json_path='.status.conditions[?(@.type=="Accepted")].status'),
        PrinterColumn(name="Function", type="string", json_path=".spec.functionName"),
        PrinterColumn(name="Used-By", type="string", json_path=".status.usedBy[*]"),
        PrinterColumn(name="Age", type="date", json_path=".metadata.creationTimestamp"),
    ]
    rules = (
        Rule(
            cel=f"has(self.spec.functionName) || self.metadata.name.matches('{FUNCTION_NAME}')",
            message="metadata.name is not a valid function name (letters, digits, _ and -; at most 64): "
            "set spec.functionName",
            holds=lambda t: t.spec.function_name is not None or matches(FUNCTION_NAME, t.metadata.get("name")),
        ),
    )

    api_version: str = "rockbot.dev/v1alpha1"
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: ToolSpec
    status: ToolStatus | None = None

    @property
    def function_name(self) -> str:
        return self.spec.function_name or self.metadata["name"]
