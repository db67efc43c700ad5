"""Tool sets: each module installs a group of tools into the registry from what the runtime offers.

A tool set is a module with `async def install(*, registry, kit) -> None` (`kit` is a `ToolKit`).
Built-in sets are found by name in `BUILTIN_SET_MODULES`; another part of rockbot adds a set by
writing its module (the `scheduling` set is expected at `rockbot.agent.toolsets.scheduling`)
or a caller passes extra modules to `AgentRuntime.from_config(..., tool_sets=[...])`.
"""
