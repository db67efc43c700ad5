"""Define a tool from a plain (async) function: the schema comes from its type hints via pydantic.

    @tool
    async def add(a: int, b: Annotated[int, Field(description="the other one")] = 0) -> int:
        '''Add two numbers.'''
        return a + b

    registry.register(add)

The first docstring paragraph becomes the description; a parameter annotated `ToolContext`
receives the call's context and is not shown to the model. Arguments are validated by the
registry against the derived schema, then converted by pydantic (so nested models arrive as
models). A synchronous function runs in a worker thread so it cannot block the event loop.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from typing import Any, get_type_hints, overload

from pydantic import ConfigDict, ValidationError, create_model

from rockbot.agent.registry import DEFAULT_TOOL_TIMEOUT, Tool, ToolContext, ToolFailure
from rockbot.contracts.errors import ErrorCode


@overload
def tool(fn: Callable[..., Any], /) -> Tool: ...


@overload
def tool(
    *, name: str | None = None, description: str | None = None, timeout: float = DEFAULT_TOOL_TIMEOUT,
    source: str = "builtin",
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    timeout: float = DEFAULT_TOOL_TIMEOUT,
    source: str = "builtin",
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Turn a function into a `Tool` (usable bare, `@tool`, or with options, `@tool(name=...)`)."""

    def build(function: Callable[..., Any]) -> Tool:
        return tool_from_function(function, name=name, description=description, timeout=timeout, source=source)

    return build(fn) if fn is not None else build


def tool_from_function(
    function: Callable[..., Any],
    *,
    name: str | None = None,
    description: str | None = None,
    timeout: float = DEFAULT_TOOL_TIMEOUT,
    source: str = "builtin",
) -> Tool:
    hints = get_type_hints(function, include_extras=True)
    fields: dict[str, Any] = {}
    context_param: str | None = None
    for param in inspect.signature(function).parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise TypeError(f"{function.__qualname__}: *args/**kwargs cannot be described to a model")
        hint = hints.get(param.name)
        if hint is None:
            raise TypeError(f"{function.__qualname__}: parameter {param.name!r} needs a type hint")
        if hint is ToolContext:
            context_param = param.name
            continue
        default = ... if param.default is param.empty else param.default
        fields[param.name] = (hint, default)
    model = create_model(  # type: ignore[call-overload]
        f"{function.__name__}_arguments", __config__=ConfigDict(extra="forbid"), **fields
    )
    doc = inspect.getdoc(function) or ""
    text = description or doc.split("\n\n")[0].replace("\n", " ").strip()
    if not text:
        raise TypeError(f"{function.__qualname__}: give the tool a description (docstring or description=...)")
    is_async = inspect.iscoroutinefunction(function)

    async def execute(args: dict[str, Any], context: ToolContext) -> Any:
        try:
            parsed = model.model_validate(args)
        except ValidationError as exc:
            raise ToolFailure(f"invalid arguments: {exc}", code=ErrorCode.INVALID_ARGUMENTS) from None
        kwargs = {key: getattr(parsed, key) for key in fields}
        if context_param is not None:
            kwargs[context_param] = context
        if is_async:
            return await function(**kwargs)
        return await asyncio.to_thread(function, **kwargs)

    return Tool(
        name=name or function.__name__,
        description=text,
        parameters=_without_titles(model.model_json_schema()),
        executor=execute,
        source=source,
        timeout=timeout,
    )


def _without_titles(schema: Any) -> Any:
    """Pydantic's auto titles cost tokens and tell the model nothing the names do not."""
    if isinstance(schema, list):
        return [_without_titles(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    cleaned: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "title" and isinstance(value, str):
            continue
        if key in ("properties", "$defs") and isinstance(value, dict):
            cleaned[key] = {name: _without_titles(sub) for name, sub in value.items()}
        else:
            cleaned[key] = _without_titles(value)
    return cleaned
