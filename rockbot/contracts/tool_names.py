"""Which tool keeps a name that two sources claim: one rule for the operator's status and the agent's registry.

A model tells tools apart by name only, so each name is offered once. Precedence, highest first:

1. built-in tools (the enabled sets, and the MCP management tools): the runtime's own names;
2. declared tools: Tool resources (in `spec.tools` order, then those the selector adds, by name) and
   sub-agents, in that order; the first one declared keeps the name;
3. tools an MCP server lists for a `tool: "*"` Tool: they fill the names that are still free.

The tool that loses is not offered (never renamed: a name the model learned must not move), a
warning names both sources and the fix, and the agent starts with everything else. What the
operator reports in `Agent.status.tools` is what it kept by this rule; the agent applies the same
rule to what only it can see (the listings of `tool: "*"` servers).
"""

from __future__ import annotations

from enum import IntEnum


class ToolRank(IntEnum):
    BUILTIN = 0
    DECLARED = 1
    LISTED = 2


_FIXES = {
    ToolRank.BUILTIN: "built-in tool sets never share a name, so report this as a bug",
    ToolRank.DECLARED: "give one of them another name (spec.functionName on its Tool, or subAgents[].toolName)",
    ToolRank.LISTED: "the model can still reach it through mcp_invoke_tool, or declare it with a Tool of its own "
    "(tool: <its name>) and a spec.functionName to offer it by name",
}


def keeps_name(*, holder: ToolRank, claimant: ToolRank) -> bool:
    """True when the tool holding a name keeps it against a later claimant (equal ranks: the first one)."""
    return holder <= claimant


def clash_warning(*, name: str, kept: str, dropped: str, dropped_rank: ToolRank) -> str:
    """The warning for a tool not offered because `kept` (a source such as `builtin:web`) holds its name.
    One sentence without semicolons: the operator joins an Agent's problems with them."""
    return (
        f"{dropped} and {kept} both offer a tool named {name!r}, so {dropped} is not offered ({kept} keeps it: "
        f"built-in tools first, then declared ones in the Agent's order, then MCP server listings): "
        f"{_FIXES[dropped_rank]}"
    )
