"""The agent runtime: one configured agent, in process, ready to chat.

    async with AgentRuntime.from_config(config, bus=bus, sandbox=sandbox) as agent:
        result = await agent.chat("session-1", "What is 6 x 7?", caller="service.local", on_event=print)
        print(result.answer)

`from_config` wires the pieces (LLM client, registry with the enabled tool sets and the config's
REST/MCP/script/agent tools, working memory, conversations, metrics); entering the context (or
`await start()`) installs the tools, which may connect to MCP servers. `chat()` runs one user
turn of a kept conversation; `complete()` runs a turn over a history the caller owns (the
stateless OpenAI endpoint). The process around it (`cli`) adds the inbox and the HTTP server;
`rockbot local` can use this class directly.

Secrets come from environment variables the operator wired from Secrets (`env`, default
`os.environ`); the runtime never needs, reads or expects a Kubernetes token.

Each turn is a span (`invoke_agent <name>`: source, outcome, rounds, tool calls, tokens), the parent
of its model requests and tool calls, and is counted in the metrics by source and outcome. Turns
and their model requests are admitted by the daily token budget (`budget`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any, Self

import aiohttp

from rockbot.agent.approvals import ApprovalGate, Approver
from rockbot.agent.budget import BudgetExhausted, TokenBudget
from rockbot.agent.conversations import Conversations
from rockbot.agent.events import EventSink
from rockbot.agent.llm import LlmClient, LlmError
from rockbot.agent.loop import LoopResult, LoopSettings, ToolLoop
from rockbot.agent.memory import WorkingMemory
from rockbot.agent.metrics import AgentMetrics
from rockbot.agent.registry import ToolRegistry
from rockbot.agent.toolsets.delegation import agent_tool
from rockbot.agent.toolsets.kit import Guides, ToolKit, ToolSetSource, builtin_modules, install_tool_sets
from rockbot.agent.toolsets.rest import rest_tool
from rockbot.agent.toolsets.scripts import script_tool
from rockbot.contracts.agent_config import AgentBackend, AgentConfig, McpBackend, RestBackend, ScriptBackend
from rockbot.contracts.conversations import HTTP_CALLER, ConversationKey
from rockbot.contracts.tool_names import ToolRank
from rockbot.telemetry import tracer

log = logging.getLogger(__name__)

HTTP_TOOL_TIMEOUT_SECONDS = 60.0
HELPER_PROMPT = (
    "You are a helper started by another agent for one task. Do the task with the tools you have and "
    "reply with a complete, self-contained answer; nobody can answer questions you ask back."
)

ChatResult = LoopResult


class AgentRuntime:
    def __init__(
        self,
        *,
        config: AgentConfig,
        llm: LlmClient,
        registry: ToolRegistry,
        kit: ToolKit,
        settings: LoopSettings,
        conversations: Conversations,
        metrics: AgentMetrics,
        budget: TokenBudget,
        tool_sets: list[ToolSetSource],
        approver: Approver | None = None,
    ):
        self.config = config
        self.llm = llm
        self.registry = registry
        self.kit = kit
        self.settings = settings
        self.conversations = conversations
        self.metrics = metrics
        self.budget = budget
        self._tool_sets = tool_sets
        self._http: aiohttp.ClientSession | None = None
        self.ready = False
        self.approvals = ApprovalGate(config=config, registry=registry, approver=approver, metrics=metrics)
        self.loop = ToolLoop(
            llm=llm, registry=registry, memory=kit.memory, settings=settings, system_prompt=config.system_prompt,
            admit=budget.admit, approvals=self.approvals,
        )  # fmt: skip

    @classmethod
    def from_config(
        cls,
        config: AgentConfig,
        *,
        bus: Any = None,
        sandbox: Any = None,
        env: Mapping[str, str] | None = None,
        tool_sets: list[ToolSetSource] | None = None,
        stream: bool = True,
        max_messages: int = 200,
        llm_max_attempts: int = 4,
        llm_backoff_seconds: float = 0.5,
        budget: TokenBudget | None = None,
        approver: Approver | None = None,
    ) -> AgentRuntime:
        """Wire an agent from its config; `tool_sets` adds modules or objects with `install(registry=, kit=)`.

        `budget` is the day's token tally (the agent process's, reported to the operator); by default one
        of this runtime alone.
        """
        env = dict(os.environ if env is None else env)
        metrics = AgentMetrics(agent=config.name)
        budget = budget or TokenBudget(tokens_per_day=config.limits.tokens_per_day)
        model = config.model
        llm = LlmClient(
            base_url=model.base_url,
            model=model.name,
            api_key=env.get(model.api_key.env) if model.api_key else None,
            api_key_env=model.api_key.env if model.api_key else None,
            temperature=model.temperature,
            timeout_seconds=model.request_timeout_seconds,
            max_attempts=llm_max_attempts,
            backoff_seconds=llm_backoff_seconds,
            observers=[metrics.observe_llm, budget.record],
        )
        registry = ToolRegistry(blacklist=config.tool_blacklist, observers=[metrics.observe_tool])
        runtime: AgentRuntime
        kit = ToolKit(
            config=config,
            memory=WorkingMemory(),
            guides=Guides(),
            http=lambda: runtime._http_session(),
            env=env,
            bus=bus,
            sandbox=sandbox,
            run_helper=lambda **kwargs: runtime._run_helper(**kwargs),
        )
        settings = LoopSettings(
            max_iterations=config.max_iterations,
            parallel_tool_calls=config.parallel_tool_calls,
            max_result_chars=model.max_result_chars,
            stream=stream,
        )
        runtime = cls(
            config=config,
            llm=llm,
            registry=registry,
            kit=kit,
            settings=settings,
            conversations=Conversations(max_messages=max_messages),
            metrics=metrics,
            budget=budget,
            tool_sets=list(tool_sets or []),
            approver=approver,
        )
        return runtime

    async def start(self) -> Self:
        """Install every tool: the config's declared tools, the enabled built-in sets, extra sets, guides last."""
        if self.ready:
            return self
        await self._install_declared_tools()
        modules: list[ToolSetSource] = [m for m in builtin_modules(self.config) if not m.endswith(".guides")]
        modules += self._tool_sets
        modules += [m for m in builtin_modules(self.config) if m.endswith(".guides")]
        await install_tool_sets(registry=self.registry, kit=self.kit, modules=modules)
        self.ready = True
        log.info("agent %s/%s ready with %d tools", self.config.namespace, self.config.name, len(self.registry))
        return self

    async def close(self) -> None:
        for closer in reversed(self.kit.closers):
            try:
                await closer()
            except Exception:
                log.exception("closing a tool set failed")
        self.kit.closers.clear()
        await self.llm.close()
        if self._http is not None:
            await self._http.close()
            self._http = None
        self.ready = False

    async def __aenter__(self) -> Self:
        try:
            return await self.start()
        except BaseException:
            await self.close()
            raise

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def conversation(self, *, caller: str, session_id: str) -> ConversationKey:
        """The key of `caller`'s session `session_id` with this agent (`caller`: the broker-validated sender)."""
        return ConversationKey(agent=self.kit.agent_id, caller=caller, session_id=session_id)

    async def chat(
        self,
        session_id: str,
        text: str,
        *,
        caller: str,
        on_event: EventSink | None = None,
        call_chain: tuple[str, ...] = (),
        source: str = "chat",
        request_id: str | None = None,
    ) -> ChatResult:
        """One user turn in `caller`'s kept conversation `session_id`; turns of one conversation run in order.

        The conversation and its working memory are `caller`'s alone (see `ConversationKey`): another
        caller using the same session id talks in a conversation of its own. `source` (the inbox
        request's kind) and `request_id` label the turn's span and metrics.
        """
        key = self.conversation(caller=caller, session_id=session_id).id
        async with self.conversations.lock(key):
            history = self.conversations.history(key)
            history.append({"role": "user", "content": text})
            try:
                return await self._turn(
                    history=history, session_id=key, call_chain=call_chain, on_event=on_event,
                    source=source, request_id=request_id,
                )  # fmt: skip
            finally:
                self.conversations.save(key, _complete_turns(history))

    async def complete(
        self, messages: list[dict[str, Any]], *, session_id: str, on_event: EventSink | None = None
    ) -> ChatResult:
        """One turn over a history the caller keeps (OpenAI semantics); nothing is stored but working memory,
        kept as the endpoint's (`HTTP_CALLER`), apart from any bus caller's."""
        key = self.conversation(caller=HTTP_CALLER, session_id=session_id).id
        return await self._turn(history=list(messages), session_id=key, on_event=on_event, source="http")

    async def admit(self, *, source: str) -> None:
        """Refuse a turn before it starts, counted as one (a stream's status is chosen before its first byte)."""
        try:
            await self.budget.admit()
        except BudgetExhausted:
            self.metrics.observe_turn(source=source, outcome="budget_exhausted", tool_calls=0)
            raise

    async def _turn(
        self,
        *,
        history: list[dict[str, Any]],
        session_id: str,
        source: str,
        on_event: EventSink | None,
        call_chain: tuple[str, ...] = (),
        request_id: str | None = None,
    ) -> ChatResult:
        """Run the loop in the turn's span, and count the turn by its outcome."""
        outcome, result = "failed", None
        with tracer.start_as_current_span(f"invoke_agent {self.config.name}") as span:
            if span.is_recording():
                span.set_attributes({
                    "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": self.config.name,
                    "gen_ai.conversation.id": session_id, "rockbot.agent.namespace": self.config.namespace,
                    "rockbot.turn.source": source, "rockbot.turn.depth": len(call_chain),
                })  # fmt: skip
                if request_id:
                    span.set_attribute("rockbot.request.id", request_id)
            try:
                result = await self.loop.run(
                    history=history, session_id=session_id, call_chain=call_chain, on_event=on_event
                )
                outcome = _outcome(result)
                return result
            except BudgetExhausted:
                outcome = "budget_exhausted"
                raise
            except LlmError:
                outcome = "llm_error"
                raise
            finally:
                calls = len(result.tools_called) if result else 0
                self.metrics.observe_turn(source=source, outcome=outcome, tool_calls=calls)
                if span.is_recording():
                    span.set_attributes({"rockbot.turn.outcome": outcome, "rockbot.turn.tool_calls": calls})
                    if result is not None:
                        span.set_attributes({
                            "rockbot.turn.iterations": result.iterations,
                            "gen_ai.usage.input_tokens": result.usage.prompt_tokens,
                            "gen_ai.usage.output_tokens": result.usage.completion_tokens,
                        })  # fmt: skip

    async def _install_declared_tools(self) -> None:
        """Tool resources and sub-agents (MCP ones come with the `mcp` set, which connects their servers)."""
        for resolved in self.config.tools:
            backend = resolved.backend
            if isinstance(backend, McpBackend):
                continue
            timeout = resolved.timeout_seconds
            if isinstance(backend, RestBackend):
                executor = rest_tool(resolved, kit=self.kit)
            elif isinstance(backend, ScriptBackend):
                executor, timeout = script_tool(resolved, kit=self.kit)
            elif isinstance(backend, AgentBackend):
                executor = agent_tool(resolved, kit=self.kit)
            else:  # pragma: no cover - the config's union is closed
                raise TypeError(f"unknown backend {backend!r}")
            function = resolved.definition.function
            self.registry.add(
                name=function.name,
                description=function.description,
                parameters=function.parameters,
                executor=executor,
                source=resolved.source,
                timeout=timeout,
                rank=ToolRank.DECLARED,
            )

    async def _http_session(self) -> aiohttp.ClientSession:
        if self._http is None:
            self._http = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=HTTP_TOOL_TIMEOUT_SECONDS),
                headers={"User-Agent": "rockbot-agent"},
            )
        return self._http

    async def _run_helper(
        self, *, instruction: str, registry: ToolRegistry, session_id: str, call_chain: tuple[str, ...]
    ) -> str:
        prompt = f"{self.config.system_prompt}\n\n{HELPER_PROMPT}".strip()
        loop = ToolLoop(llm=self.llm, registry=registry, memory=self.kit.memory, settings=self.settings,
                        system_prompt=prompt, admit=self.budget.admit, approvals=self.approvals)
        result = await loop.run(
            history=[{"role": "user", "content": instruction}], session_id=session_id, call_chain=call_chain
        )
        return result.answer


def _outcome(result: LoopResult) -> str:
    if result.budget_exhausted:
        return "budget_exhausted"
    return "iteration_limit" if result.hit_iteration_limit else "answered"


def _complete_turns(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """History up to the last finished turn: a turn that failed midway (the model endpoint went away)
    is dropped whole, so the kept history never ends in unanswered tool calls, which providers reject."""
    for end in range(len(history), 0, -1):
        message = history[end - 1]
        if message.get("role") == "assistant" and not message.get("tool_calls"):
            return history[:end]
    return []
