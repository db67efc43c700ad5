"""What a tool set may use to build its tools, and how the runtime finds and installs tool sets.

The `ToolKit` is the one object handed to every tool set: the agent's config, its working
memory, the usage-guide shelf, a shared HTTP session, the environment (for secrets the operator
wired), and the optional bus and sandbox client. Tool sets take what they need and nothing else.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Protocol

import aiohttp
from pydantic import BaseModel, ConfigDict

from rockbot.agent.long_term_memory import LongTermMemory
from rockbot.agent.memory import WorkingMemory
from rockbot.agent.registry import ToolRegistry
from rockbot.contracts.agent_config import AgentConfig, McpBackend
from rockbot.contracts.builtin_tools import BUILTIN_TOOLS, LONG_TERM_MEMORY_TOOLS

log = logging.getLogger(__name__)

#: The whole time an HTTP tool's request may take (REST Tools, web search).
HTTP_TOOL_TIMEOUT_SECONDS = 60.0

#: Built-in set name (as in `AgentConfig.builtin_tools`) -> the module that installs it.
BUILTIN_SET_MODULES: dict[str, str] = {
    "scripts": "rockbot.agent.toolsets.scripts",
    "web": "rockbot.agent.toolsets.web",
    "scheduling": "rockbot.agent.toolsets.scheduling",
    "memory": "rockbot.agent.toolsets.memory",
    "subagents": "rockbot.agent.toolsets.subagents",
    "guides": "rockbot.agent.toolsets.guides",
    "mcp": "rockbot.agent.toolsets.mcp_servers",
}


class Guide(BaseModel):
    """A Markdown usage guide a tool set offers through `get_tool_guide(name)`."""

    model_config = ConfigDict(frozen=True)

    name: str
    summary: str
    document: str


class Guides:
    def __init__(self) -> None:
        self._guides: dict[str, Guide] = {}

    def add(self, guide: Guide) -> None:
        if guide.name in self._guides:
            raise ValueError(f"a tool guide named {guide.name!r} already exists")
        self._guides[guide.name] = guide

    def get(self, name: str) -> Guide | None:
        return self._guides.get(name)

    def all(self) -> list[Guide]:
        return list(self._guides.values())


class Helpers(Protocol):
    """Runs a short-lived helper loop with some of the parent's tools (provided by the runtime)."""

    async def __call__(
        self, *, instruction: str, registry: ToolRegistry, session_id: str, call_chain: tuple[str, ...]
    ) -> str: ...


@dataclass
class ToolKit:
    config: AgentConfig
    memory: WorkingMemory
    guides: Guides
    http: Callable[[], Awaitable[aiohttp.ClientSession]]
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    bus: Any = None
    sandbox: Any = None
    run_helper: Helpers | None = None
    #: Long-term memory (the Agent's spec.memory.longTerm), when enabled.
    long_term: LongTermMemory | None = None
    closers: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    #: What went wrong while installing tools, a sentence each for whoever started the agent (the log has more).
    notices: list[str] = field(default_factory=list)

    @property
    def agent_id(self) -> str:
        """How this agent appears in call chains: `namespace/name`."""
        return f"{self.config.namespace}/{self.config.name}"

    def secret(self, env: str) -> str | None:
        value = self.env.get(env)
        return value or None


class ToolSet(Protocol):
    """A tool set that is an object rather than a module (one built around a running service, say)."""

    async def install(self, *, registry: ToolRegistry, kit: ToolKit) -> None: ...


ToolSetSource = str | ModuleType | ToolSet


async def install_tool_sets(*, registry: ToolRegistry, kit: ToolKit, modules: list[ToolSetSource]) -> None:
    for module in modules:
        loaded = importlib.import_module(module) if isinstance(module, str) else module
        await loaded.install(registry=registry, kit=kit)


def builtin_modules(config: AgentConfig) -> list[str]:
    """The modules of the config's enabled built-in sets; a set this build lacks is skipped with a warning.

    MCP Tools need the `mcp` set's module (it connects their servers), so it is installed for them too."""
    modules = []
    sets = list(config.builtin_tools)
    if "mcp" not in sets and any(isinstance(tool.backend, McpBackend) for tool in config.tools):
        sets.append("mcp")
    for tool_set in sets:
        module = BUILTIN_SET_MODULES[tool_set]
        if importlib.util.find_spec(module) is None:
            log.warning("built-in tool set %r is not available in this build (no module %s); skipping it",
                        tool_set, module)
            continue
        modules.append(module)
    return modules


def catalogue_description(name: str) -> str:
    """The description the catalogue gives a built-in tool (what the operator reports is what the model sees)."""
    for tool in (*BUILTIN_TOOLS, *LONG_TERM_MEMORY_TOOLS):
        if tool.name == name:
            return tool.description
    raise KeyError(f"{name!r} is not in the built-in tool catalogue")
