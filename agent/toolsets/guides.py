"""The `guides` set: Markdown usage guides that the other tool sets put on the shelf.

Installed last so every other set has added its guide; the model lists them, then reads the one
it needs instead of carrying every guide in the system prompt.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from rockbot.agent.defining import tool
from rockbot.agent.registry import ToolFailure, ToolRegistry
from rockbot.agent.toolsets.kit import ToolKit, catalogue_description
from rockbot.contracts.errors import ErrorCode


async def install(*, registry: ToolRegistry, kit: ToolKit) -> None:
    guides = kit.guides

    @tool(name="list_tool_guides", description=catalogue_description("list_tool_guides"))
    async def list_tool_guides() -> str:
        shelf = guides.all()
        if not shelf:
            return "No tool guides are available."
        return "\n".join(["| Guide | Summary |", "|---|---|", *(f"| {g.name} | {g.summary} |" for g in shelf)])

    @tool(name="get_tool_guide", description=catalogue_description("get_tool_guide"))
    async def get_tool_guide(name: Annotated[str, Field(description="A guide name from list_tool_guides.")]) -> str:
        guide = guides.get(name)
        if guide is None:
            names = ", ".join(g.name for g in guides.all()) or "none"
            raise ToolFailure(f"no tool guide named {name!r}; available: {names}", code=ErrorCode.INVALID_ARGUMENTS)
        return guide.document

    registry.register(list_tool_guides)
    registry.register(get_tool_guide)
