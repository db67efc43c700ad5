"""Who refers to whom in a namespace: what one Agent's change or a Tool's change concerns.

An `AgentRef` is the little of an Agent that other objects depend on (its description for the
Agents that call it, the Tools it names or selects, its sub-agents); the operator keeps one per
Agent instead of whole bodies, and answers "which Agents use this Tool" (a Tool's `usedBy`) and
"which Agents must be reconciled when this one changes" from them without validating any model.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from rockbot.operator.resolving import selector_matches
from rockbot.resources.agent import LabelSelector

K8sObject = dict[str, Any]


@dataclass(frozen=True, slots=True)
class AgentRef:
    name: str
    generation: int | None
    description: str
    tools: tuple[str, ...]
    selector: LabelSelector | None
    sub_agents: tuple[str, ...]

    @classmethod
    def of(cls, body: K8sObject) -> AgentRef:
        spec = body.get("spec") or {}
        selector = spec.get("toolSelector")
        return cls(
            name=body["metadata"]["name"],
            generation=body["metadata"].get("generation"),
            description=spec.get("description") or "",
            tools=tuple(spec.get("tools") or ()),
            selector=None if selector is None else LabelSelector.model_validate(selector),
            sub_agents=tuple(ref.get("name", "") for ref in spec.get("subAgents") or ()),
        )

    def uses(self, tool: K8sObject) -> bool:
        """Whether the Agent asks for this (existing) Tool, by name or by its selector."""
        metadata = tool["metadata"]
        if metadata["name"] in self.tools:
            return True
        return self.selector is not None and selector_matches(self.selector, metadata.get("labels") or {})

    def calls(self, agent: str, via: Iterable[K8sObject]) -> bool:
        """Whether the Agent offers `agent` as a tool: as a sub-agent, or through one of the Tools `via` (those
        backed by `agent`, see `tools_calling`) that it uses."""
        return agent in self.sub_agents or any(self.uses(tool) for tool in via)


def tools_calling(agent: str, tools: Iterable[K8sObject]) -> list[K8sObject]:
    """The Tools backed by `agent`: worked out once per change, not once per Agent of the namespace."""
    return [tool for tool in tools if ((tool.get("spec") or {}).get("agent") or {}).get("name") == agent]


def used_by(tool: K8sObject, agents: Iterable[AgentRef]) -> list[str]:
    """A Tool's `usedBy`: the Agents that ask for it, sorted."""
    return sorted(agent.name for agent in agents if agent.uses(tool))


class AgentsByName(Mapping[str, K8sObject]):
    """The namespace's Agents as `resolve_agent` reads them: by name, with their description.

    Indexed on first use only: most Agents call no other, and a reconcile of each must not cost a pass
    over every Agent of the namespace.
    """

    def __init__(self, refs: Iterable[AgentRef]) -> None:
        self._given = refs
        self._by_name: dict[str, AgentRef] | None = None

    @property
    def _refs(self) -> dict[str, AgentRef]:
        if self._by_name is None:
            self._by_name = {ref.name: ref for ref in self._given}
        return self._by_name

    def __getitem__(self, name: str) -> K8sObject:
        ref = self._refs[name]
        return {"metadata": {"name": ref.name}, "spec": {"description": ref.description}}

    def __iter__(self) -> Iterator[str]:
        return iter(self._refs)

    def __len__(self) -> int:
        return len(self._refs)
