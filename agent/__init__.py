"""The agent runtime: an LLM tool-calling loop that talks to the rest over the bus.

Public API: `rockbot.agent.runtime.AgentRuntime` (in-process agent: `from_config`, `chat`,
`complete`), `rockbot.agent.registry.ToolRegistry` with `rockbot.agent.defining.tool`, the
progress events in `rockbot.agent.events`, and `rockbot agent --config FILE` (`cli`).
"""
