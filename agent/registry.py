"""The tool registry: named tools with a JSON Schema, validated arguments, and failures as data.

The model calls tools by name with JSON it wrote itself, so anything may be wrong: an unknown or
blacklisted name, malformed JSON, arguments that break the schema, a backend that is slow or
broken. `ToolRegistry.invoke` is the one edge where each of these becomes an `ErrorInfo` the
model can read and act on; a tool call never raises into the loop.

Every tool runs under a timeout (`DEFAULT_TOOL_TIMEOUT`, 30 s, unless the tool sets its own).
Blacklisted tools stay registered (so a call can be answered `Blacklisted` rather than
`ToolNotFound`) but are never offered to the model.

Names are unique. Two tools from different sources that claim one name are settled by the rule
the operator also applies (`rockbot.contracts.tool_names`: built-ins, then declared tools, then MCP
server listings), with a warning; two built-ins of one name are a programming error
(`ToolAlreadyExists`).

Each call is a span (`execute_tool <name>`: tool, call id, source, outcome code); its arguments and
result go into it only with the content opt-in (`rockbot.telemetry`).
"""

from __future__ import annotations

import asyncio
import difflib
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import jsonschema
from opentelemetry.trace import Span, Status, StatusCode
from pydantic import BaseModel, ConfigDict

from rockbot.contracts.builtin_tools import builtin_source
from rockbot.contracts.errors import ErrorCode, ErrorInfo
from rockbot.contracts.tool_names import ToolRank, clash_warning, keeps_name
from rockbot.telemetry import capture_content, tracer

log = logging.getLogger(__name__)

DEFAULT_TOOL_TIMEOUT = 30.0
#: How metrics and spans name a tool the model invented (any string would be a new series or span name).
UNKNOWN_TOOL = "<unknown>"
_NAME_PATTERN = r"^[a-zA-Z0-9_-]{1,64}$"


class ToolContext(BaseModel):
    """Who is calling: tools that keep per-conversation state or call other agents need it."""

    model_config = ConfigDict(frozen=True)

    session_id: str
    tool_call_id: str = ""
    call_chain: tuple[str, ...] = ()


Executor = Callable[[dict[str, Any], ToolContext], Awaitable[Any]]


class ToolFailure(Exception):
    """Raised by a tool to answer with a specific error code instead of `ExecutionFailed`."""

    def __init__(self, message: str, *, code: ErrorCode = ErrorCode.EXECUTION_FAILED, retryable: bool = False):
        super().__init__(message)
        self.info = ErrorInfo(code=code, message=message, retryable=retryable)


class ToolAlreadyExists(ValueError):
    """Two tools cannot share a name: the model could not tell them apart."""


class InvalidToolDefinition(ValueError):
    """A tool's name or parameter schema is unusable (raised at registration, not at call time)."""


@dataclass(frozen=True)
class Tool:
    """A callable tool. `source` tells where it comes from (`builtin`, `tool:<name>`, `mcp:<server>`...);
    `rank` is its place when another source claims its name."""

    name: str
    description: str
    parameters: Mapping[str, Any]
    executor: Executor
    source: str = "builtin"
    timeout: float = DEFAULT_TOOL_TIMEOUT
    rank: ToolRank = ToolRank.BUILTIN
    _validator: Any = field(default=None, repr=False, compare=False)

    @property
    def label(self) -> str:
        """The source as the operator's status names it (`builtin:web`, `tool:weather`, `mcp:rocks`)."""
        return builtin_source(self.name) if self.rank == ToolRank.BUILTIN else self.source

    def openai(self) -> dict[str, Any]:
        """The tool in OpenAI's Chat Completions `tools` format."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": dict(self.parameters)},
        }


class ToolInfo(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    description: str
    parameters: dict[str, Any]
    source: str


class ToolOutcome(BaseModel):
    """What one tool call produced: `content` on success, `error` otherwise."""

    model_config = ConfigDict(frozen=True)

    tool_call_id: str
    name: str  # as the model wrote it, which may be any string
    known: bool = True  # False when no tool of that name exists (the name is the model's invention)
    content: str = ""
    error: ErrorInfo | None = None
    duration_seconds: float = 0.0
    #: The arguments as the model wrote them, and where the tool comes from (for the run store's timeline).
    arguments: str = ""
    source: str = ""

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def status(self) -> str:
        """The metrics label: `ok` or the error code."""
        return "ok" if self.error is None else self.error.code.value

    def for_model(self) -> str:
        """The `role: tool` message content: the result, or the error as JSON the model can read."""
        if self.error is None:
            return self.content
        return json.dumps({"error": self.error.model_dump(mode="json")})


InvocationObserver = Callable[[ToolOutcome], None]


class ToolRegistry:
    """Tools by unique name. Not thread-safe by design: the agent runs on one event loop."""

    def __init__(self, *, blacklist: Iterable[str] = (), observers: Iterable[InvocationObserver] = ()):
        self._tools: dict[str, Tool] = {}
        self._blacklist = frozenset(blacklist)
        self._observers = list(observers)
        self._openai_cache: list[dict[str, Any]] | None = None

    # -- registration -------------------------------------------------------------------------

    def register(self, tool: Tool) -> Tool | None:
        """Add a tool whose schema is a valid JSON Schema for an object. A name another source holds goes to
        the tool of higher rank (None, with a warning, when that is the one already registered)."""
        checked = _checked(tool)
        existing = self._tools.get(tool.name)
        if existing is not None:
            if existing.rank == tool.rank == ToolRank.BUILTIN:
                raise ToolAlreadyExists(
                    f"tool {tool.name!r} already exists (from {existing.source}); register this one under a "
                    f"different name, e.g. {_suggest_name(tool, self._tools)!r}"
                )
            holds = keeps_name(holder=existing.rank, claimant=tool.rank)
            kept, dropped = (existing, tool) if holds else (tool, existing)
            log.warning(
                clash_warning(name=tool.name, kept=kept.label, dropped=dropped.label, dropped_rank=dropped.rank)
            )
            if holds:
                return None
        self._tools[tool.name] = checked
        self._openai_cache = None
        return checked

    def add(
        self,
        *,
        name: str,
        description: str,
        parameters: Mapping[str, Any],
        executor: Executor,
        source: str = "builtin",
        timeout: float = DEFAULT_TOOL_TIMEOUT,
        rank: ToolRank = ToolRank.BUILTIN,
    ) -> Tool | None:
        """Register a tool from a raw JSON Schema (full control over what the model sees)."""
        return self.register(
            Tool(
                name=name,
                description=description,
                parameters=parameters,
                executor=executor,
                source=source,
                timeout=timeout,
                rank=rank,
            )
        )

    def unregister(self, name: str) -> Tool:
        try:
            tool = self._tools.pop(name)
        except KeyError:
            raise KeyError(f"tool {name!r} is not registered") from None
        self._openai_cache = None
        return tool

    # -- lookup -------------------------------------------------------------------------------

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __len__(self) -> int:
        return len(self._tools)

    def is_blacklisted(self, name: str) -> bool:
        return name in self._blacklist

    def list(self) -> list[ToolInfo]:
        """Every registered tool (blacklisted ones too), in registration order."""
        return [
            ToolInfo(name=t.name, description=t.description, parameters=dict(t.parameters), source=t.source)
            for t in self._tools.values()
        ]

    def openai_tools(self) -> list[dict[str, Any]]:
        """What the model is offered: every tool that is not blacklisted, in OpenAI function format."""
        if self._openai_cache is None:
            self._openai_cache = [t.openai() for t in self._tools.values() if t.name not in self._blacklist]
        return self._openai_cache

    def subset(self, names: Iterable[str]) -> ToolRegistry:
        """A registry sharing some of these tools (and the blacklist and observers), for helpers."""
        child = ToolRegistry(blacklist=self._blacklist, observers=self._observers)
        for name in names:
            tool = self._tools.get(name)
            if tool is None:
                raise KeyError(f"tool {name!r} is not registered; known tools: {', '.join(sorted(self._tools))}")
            child._tools[name] = tool
        return child

    # -- invocation ---------------------------------------------------------------------------

    async def invoke(self, name: str, arguments: str | Mapping[str, Any], *, context: ToolContext) -> ToolOutcome:
        """Run one tool call in its span; never raises for anything the call itself got wrong."""
        known = name in self._tools or name in self._blacklist
        with tracer.start_as_current_span(f"execute_tool {name if known else UNKNOWN_TOOL}") as span:
            started = time.perf_counter()
            try:
                content = await self._run(name, arguments, context)
                outcome = ToolOutcome(tool_call_id=context.tool_call_id, name=name, content=content)
            except ToolFailure as failure:
                outcome = ToolOutcome(tool_call_id=context.tool_call_id, name=name, error=failure.info, known=known)
            tool = self._tools.get(name)
            outcome = outcome.model_copy(update={
                "duration_seconds": time.perf_counter() - started, "arguments": _as_text(arguments),
                "source": tool.label if tool is not None else "",
            })  # fmt: skip
            if span.is_recording():
                self._describe(span, outcome, arguments)
        for observer in self._observers:
            observer(outcome)
        return outcome

    def refuse(self, name: str, arguments: str, *, context: ToolContext, error: ErrorInfo) -> ToolOutcome:
        """Answer a call that may not run (a person denied it) as a failed call, seen by every observer."""
        return self.answer(name, arguments, context=context, error=error)

    def answer(self, name: str, arguments: str, *, context: ToolContext, content: str = "",
               error: ErrorInfo | None = None) -> ToolOutcome:
        """Answer a call without running it (refused, or a recorded replay's recorded result), seen by every
        observer."""
        tool = self._tools.get(name)
        outcome = ToolOutcome(tool_call_id=context.tool_call_id, name=name, content=content, error=error,
                              arguments=arguments, source=tool.label if tool is not None else "")
        for observer in self._observers:
            observer(outcome)
        return outcome

    def _describe(self, span: Span, outcome: ToolOutcome, arguments: str | Mapping[str, Any]) -> None:
        """GenAI conventions for a tool call; arguments and result only with the content opt-in."""
        tool = self._tools.get(outcome.name)
        span.set_attributes({
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": outcome.name if outcome.known else UNKNOWN_TOOL,
            "gen_ai.tool.call.id": outcome.tool_call_id,
            "rockbot.tool.source": tool.label if tool is not None else "",
            "rockbot.tool.outcome": outcome.status,
        })  # fmt: skip
        if capture_content():
            span.set_attribute("gen_ai.tool.call.arguments", _as_text(arguments))
            span.set_attribute("gen_ai.tool.call.result", outcome.for_model())
        if outcome.error is not None:  # the code only: a message may quote the model's arguments
            span.set_status(Status(StatusCode.ERROR, outcome.status))
            span.set_attribute("error.type", outcome.status)

    async def _run(self, name: str, arguments: str | Mapping[str, Any], context: ToolContext) -> str:
        if name in self._blacklist:
            raise ToolFailure(
                f"tool {name!r} is disabled for this agent (blacklisted); do not call it again",
                code=ErrorCode.BLACKLISTED,
            )
        tool = self._tools.get(name)
        if tool is None:
            offered = [n for n in self._tools if n not in self._blacklist]
            close = difflib.get_close_matches(name, offered, n=3)
            hint = f"did you mean {', '.join(map(repr, close))}?" if close else f"available: {', '.join(offered)}"
            raise ToolFailure(f"no tool named {name!r}; {hint}", code=ErrorCode.TOOL_NOT_FOUND)
        args = _parse_arguments(arguments)
        errors = sorted(tool._validator.iter_errors(args), key=lambda e: list(e.absolute_path))
        if errors:
            details = "; ".join(_describe(error) for error in errors[:5])
            raise ToolFailure(f"invalid arguments for {name!r}: {details}", code=ErrorCode.INVALID_ARGUMENTS)
        try:
            async with asyncio.timeout(tool.timeout):
                result = await tool.executor(args, context)
        except TimeoutError:
            raise ToolFailure(
                f"tool {name!r} did not finish within {tool.timeout:g} s", code=ErrorCode.TIMEOUT, retryable=True
            ) from None
        except ToolFailure:
            raise
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the edge: any failure of the tool becomes data for the model
            raise ToolFailure(f"tool {name!r} failed: {type(exc).__name__}: {exc}") from exc
        return _as_text(result)


def _checked(tool: Tool) -> Tool:
    if not re.match(_NAME_PATTERN, tool.name):
        raise InvalidToolDefinition(
            f"tool name {tool.name!r} is not allowed: use 1-64 letters, digits, '_' or '-' (OpenAI's rule)"
        )
    if tool.timeout <= 0:
        raise InvalidToolDefinition(f"tool {tool.name!r}: timeout must be positive, got {tool.timeout}")
    schema = dict(tool.parameters)
    if schema.get("type") != "object":
        raise InvalidToolDefinition(
            f"tool {tool.name!r}: parameters must be a JSON Schema whose type is 'object', "
            f"got {schema.get('type')!r}"
        )
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise InvalidToolDefinition(
            f"tool {tool.name!r}: parameters are not a valid JSON Schema: {exc.message}"
        ) from exc
    validator = jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())
    return Tool(
        name=tool.name,
        description=tool.description,
        parameters=schema,
        executor=tool.executor,
        source=tool.source,
        timeout=tool.timeout,
        rank=tool.rank,
        _validator=validator,
    )


def _suggest_name(tool: Tool, taken: Mapping[str, Tool]) -> str:
    prefix = tool.source.split(":")[-1].replace(".", "_")
    for candidate in (f"{prefix}_{tool.name}", *(f"{tool.name}_{n}" for n in range(2, 100))):
        if candidate not in taken and len(candidate) <= 64:
            return candidate
    return f"{tool.name[:60]}_new"


def _parse_arguments(arguments: str | Mapping[str, Any]) -> dict[str, Any]:
    if isinstance(arguments, Mapping):
        return dict(arguments)
    if not arguments.strip():
        return {}
    try:
        parsed = json.loads(arguments)
    except ValueError as exc:
        raise ToolFailure(
            f"arguments are not valid JSON ({exc}); send a JSON object matching the tool's schema",
            code=ErrorCode.INVALID_ARGUMENTS,
        ) from None
    if not isinstance(parsed, dict):
        raise ToolFailure(
            f"arguments must be a JSON object, got {type(parsed).__name__}", code=ErrorCode.INVALID_ARGUMENTS
        )
    return parsed


def _describe(error: jsonschema.ValidationError) -> str:
    where = "/".join(str(p) for p in error.absolute_path)
    return f"{where}: {error.message}" if where else error.message


def _as_text(result: Any) -> str:
    if isinstance(result, str):
        return result
    if isinstance(result, BaseModel):
        return result.model_dump_json()
    if result is None:
        return ""
    return json.dumps(result, ensure_ascii=False, default=str)
