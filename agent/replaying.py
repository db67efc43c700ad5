"""A `recorded` replay's tool calls: answered from the recorded run instead of run (see `contracts.inbox.Replay`).

A call gets a recorded result when a recorded call of the same name has the same arguments (compared as JSON
values, so key order and spacing do not matter); each recorded call answers once, in the order they were made, so
a model that calls a tool twice gets both recorded results. A call without a match is answered as not run, and
the run records it so (its message starts with `NOT_REPLAYED`): replaying never runs a tool with side effects.
The working-memory reader is the one tool that runs: a long recorded result goes to this turn's working memory, and
the model reads it back from there (`loop.READER`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from rockbot.contracts.errors import ErrorCode, ErrorInfo
from rockbot.contracts.inbox import NOT_REPLAYED, RecordedCall


def _same(arguments: str) -> object:
    """The arguments as a comparable value: parsed JSON, else the text without surrounding blanks."""
    try:
        return json.loads(arguments or "{}")
    except ValueError:
        return arguments.strip()


class RecordedTools:
    """The recorded calls a replay's turn may still be answered with."""

    def __init__(self, calls: Iterable[RecordedCall]) -> None:
        self._left = [(call, _same(call.arguments)) for call in calls]

    def take(self, name: str, arguments: str) -> RecordedCall | None:
        """The first recorded call of `name` with these arguments not answered yet (then used up), or None."""
        wanted = _same(arguments)
        for index, (call, same) in enumerate(self._left):
            if call.name == name and same == wanted:
                del self._left[index]
                return call
        return None

    @staticmethod
    def not_recorded(name: str) -> ErrorInfo:
        return ErrorInfo(code=ErrorCode.REJECTED, message=(
            f"{NOT_REPLAYED}: the recorded run made no call of {name} with these arguments, and a recorded replay "
            "runs no tool; answer without it"))  # fmt: skip

    @staticmethod
    def error_of(call: RecordedCall) -> ErrorInfo | None:
        """The recorded call's error (its code as recorded, its message the recorded result), None if it succeeded."""
        if not call.error_code:
            return None
        code = call.error_code if call.error_code in ErrorCode._value2member_map_ else ErrorCode.EXECUTION_FAILED
        return ErrorInfo(code=ErrorCode(code), message=call.result or call.error_code)
