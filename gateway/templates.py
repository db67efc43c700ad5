"""A Trigger's prompt: a Jinja2 template rendered in Jinja2's sandbox, bounded in size and in time.

The sandbox keeps a template from reaching Python internals (attributes starting with `_`, unsafe
methods, huge ranges). What it does not bound is work: two nested loops over a payload can spin for
minutes, so a render runs in a worker thread under a deadline (checked on every line the compiled
template runs) and stops at `MAX_PROMPT_CHARS`. A template that does not compile is reported where
it is declared (a condition on the Trigger); a render that fails fails that run with the reason.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import Any

import jinja2
from jinja2.sandbox import SandboxedEnvironment

#: The longest prompt a template may render (an inbox request is at most 1 MiB, escapes included).
MAX_PROMPT_CHARS = 256 * 1024
RENDER_SECONDS = 1.0
#: The file name Jinja2 gives the code it compiles from a string.
_COMPILED = "<template>"

#: A field the payload lacks renders empty (and `when` compares it as such): webhooks of one sender
#: vary by event, and `| default(...)` says what to write instead.
_ENVIRONMENT = SandboxedEnvironment(autoescape=False, keep_trailing_newline=True, undefined=jinja2.ChainableUndefined)


class TemplateProblem(Exception):
    """A template or `when` expression that does not compile; the message names the field and the line."""


class RenderError(Exception):
    """A render that failed, ran too long or wrote too much."""


@dataclass(frozen=True)
class Prompt:
    """A Trigger's compiled `prompt` and `when`; compile once per generation, render per delivery."""

    template: jinja2.Template
    when: Callable[..., Any] | None

    @classmethod
    def compile(cls, *, prompt: str, when: str | None) -> Prompt:
        try:
            template = _ENVIRONMENT.from_string(prompt)
        except jinja2.TemplateSyntaxError as exc:
            raise TemplateProblem(f"spec.prompt: line {exc.lineno}: {exc.message}") from None
        try:
            condition = None if when is None else _ENVIRONMENT.compile_expression(when)
        except jinja2.TemplateSyntaxError as exc:
            raise TemplateProblem(f"spec.when: {exc.message}") from None
        return cls(template=template, when=condition)

    async def applies(self, context: dict[str, Any]) -> bool:
        """Whether `when` holds for this delivery (always, without one)."""
        if self.when is None:
            return True
        return bool(await asyncio.to_thread(_bounded, lambda: self.when(**context), what="spec.when"))

    async def render(self, context: dict[str, Any]) -> str:
        return await asyncio.to_thread(_bounded, lambda: self._write(context), what="spec.prompt")

    def _write(self, context: dict[str, Any]) -> str:
        written: list[str] = []
        size = 0
        for chunk in self.template.generate(context):
            size += len(chunk)
            if size > MAX_PROMPT_CHARS:
                raise RenderError(f"spec.prompt rendered more than {MAX_PROMPT_CHARS} characters: render less "
                                  "(e.g. a field of the payload, not all of it)")
            written.append(chunk)
        return "".join(written)


def _bounded(render: Callable[[], Any], *, what: str) -> Any:
    """`render()` in this (worker) thread, stopped when the compiled template runs past the deadline."""
    deadline = time.monotonic() + RENDER_SECONDS

    def each_line(frame: FrameType, event: str, arg: object) -> Any:
        if time.monotonic() > deadline:
            raise RenderError(f"{what} took longer than {RENDER_SECONDS:g} s to render: loop over less")
        return each_line

    def on_call(frame: FrameType, event: str, arg: object) -> Any:
        return each_line if frame.f_code.co_filename == _COMPILED else None

    sys.settrace(on_call)
    try:
        return render()
    except RenderError:
        raise
    except jinja2.TemplateError as exc:
        raise RenderError(f"{what}: {exc}") from None
    except Exception as exc:  # the template's own errors (a division by zero, a bad filter argument)
        raise RenderError(f"{what}: {type(exc).__name__}: {exc}") from None
    finally:
        sys.settrace(None)
