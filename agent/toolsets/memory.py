"""The `memory` set: read back the chunks of large tool results kept in working memory.

Enabling the set offers `get_from_working_memory` (and its guide) from the start. Without it the
loop still installs the reader (`reader`) the first time a result is chunked, because any tool can
return a large result and an index of keys the model cannot read would be useless; only a
blacklisted reader means results are cut instead.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from rockbot.agent.defining import tool
from rockbot.agent.memory import WorkingMemory
from rockbot.agent.registry import Tool, ToolContext, ToolFailure, ToolRegistry
from rockbot.agent.toolsets.kit import Guide, ToolKit, catalogue_description
from rockbot.contracts.errors import ErrorCode

GUIDE = Guide(
    name="working-memory",
    summary="How large tool results are split into chunks and read back.",
    document=(
        "# Working memory\n\n"
        "A tool result that is too long for your context is split into chunks and replaced by an index "
        "of keys. Call `get_from_working_memory(key)` for each chunk you need, in order, before "
        "answering. Chunks expire after about 20 minutes; call the tool again to get a fresh copy.\n"
    ),
)


def reader(memory: WorkingMemory) -> Tool:
    """The `get_from_working_memory` tool over `memory`."""

    @tool(name="get_from_working_memory", description=catalogue_description("get_from_working_memory"))
    async def get_from_working_memory(
        key: Annotated[str, Field(description="A key from the index, e.g. `ab12cd-0`.")],
        context: ToolContext,
    ) -> str:
        value = await memory.read(session_id=context.session_id, key=key)
        if value is None:
            known = memory.keys(session_id=context.session_id)
            hint = f"keys available now: {', '.join(known[:20])}" if known else "this session has no stored chunks"
            raise ToolFailure(
                f"no working-memory entry {key!r} (it expired or never existed); {hint}",
                code=ErrorCode.INVALID_ARGUMENTS,
            )
        return value

    return get_from_working_memory


async def install(*, registry: ToolRegistry, kit: ToolKit) -> None:
    registry.register(reader(kit.memory))
    kit.guides.add(GUIDE)
