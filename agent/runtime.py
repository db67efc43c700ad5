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

import asyncio
import logging
import os
from collections.abc import Mapping
from typing import Any, Self

import aiohttp
from opentelemetry import trace

from rockbot.agent.approvals import ApprovalGate, Approver
from rockbot.agent.budget import BudgetExhausted, TokenBudget
from rockbot.agent.conversations import Conversations, trimmed
from rockbot.agent.embeddings import Embedder
from rockbot.agent.events import EventSink
from rockbot.agent.llm import LlmClient, LlmError
from rockbot.agent.long_term_memory import LongTermMemory, MemoryDesk
from rockbot.agent.loop import LoopResult, LoopSettings, ToolLoop
from rockbot.agent.memory import WorkingMemory
from rockbot.agent.metrics import AgentMetrics
from rockbot.agent.recording import HistorySource, Publish, Redactor, RunRecorder, secrets_of
from rockbot.agent.registry import ToolRegistry
from rockbot.agent.toolsets.a2a_agents import a2a_tool
from rockbot.agent.toolsets.delegation import agent_tool
from rockbot.agent.toolsets.kit import (
    HTTP_TOOL_TIMEOUT_SECONDS,
    Guides,
    ToolKit,
    ToolSetSource,
    builtin_modules,
    install_tool_sets,
)
from rockbot.agent.toolsets.rest import rest_tool
from rockbot.agent.toolsets.scripts import script_tool
from rockbot.contracts.agent_config import A2ABackend, AgentBackend, AgentConfig, McpBackend, RestBackend, ScriptBackend
from rockbot.contracts.conversations import HTTP_CALLER, ConversationKey
from rockbot.contracts.inbox import Replay
from rockbot.contracts.recording import HistoryReply
from rockbot.contracts.tool_names import ToolRank
from rockbot.telemetry import tracer

log = logging.getLogger(__name__)

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
        recorder: RunRecorder | None = None,
        history: HistorySource | None = None,
    ):
        self.config = config
        self.recorder = recorder or RunRecorder(publish=None, namespace=config.namespace, agent=config.name)
        self.history = history
        #: The last run of each conversation this process did: its recorded history is newer only if it holds it.
        self._last_runs: dict[str, str] = {}
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
        publish_runs: Publish | None = None,
        history: HistorySource | None = None,
        memory_desk: MemoryDesk | None = None,
    ) -> AgentRuntime:
        """Wire an agent from its config; `tool_sets` adds modules or objects with `install(registry=, kit=)`.

        `budget` is the day's token tally (the agent process's, reported to the operator); by default one
        of this runtime alone. `publish_runs` sends run events to the console (the config's `runs` policy says
        what they keep); `history` reads a session's recorded history (other replicas' turns, earlier pods');
        `memory_desk` keeps and searches long-term memories (the console), when the config enables them.
        """
        env = dict(os.environ if env is None else env)
        metrics = AgentMetrics(agent=config.name)
        budget = budget or TokenBudget(tokens_per_day=config.limits.tokens_per_day)
        redact = secrets_of(config, env)
        recorder = RunRecorder(
            publish=publish_runs, namespace=config.namespace, agent=config.name, record=config.runs.record,
            retention_days=config.runs.retention_days, redact=redact, registry=metrics.registry,
        )  # fmt: skip
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
            observers=[metrics.observe_llm, budget.record, recorder.observe_llm],
        )
        registry = ToolRegistry(blacklist=config.tool_blacklist,
                                observers=[metrics.observe_tool, recorder.observe_tool])
        runtime: AgentRuntime
        kit = ToolKit(
            config=config,
            memory=WorkingMemory(observers=[recorder.observe_memory],
                                 recall=lambda session, key: runtime._recall(session_key=session, key=key)),
            guides=Guides(),
            http=lambda: runtime._http_session(),
            env=env,
            bus=bus,
            sandbox=sandbox,
            run_helper=lambda **kwargs: runtime._run_helper(**kwargs),
            long_term=_long_term_memory(config, env=env, desk=memory_desk, redact=redact),
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
            recorder=recorder,
            history=history,
        )
        return runtime

    async def start(self) -> Self:
        """Install every tool: the config's declared tools, the enabled built-in sets, extra sets, guides last."""
        if self.ready:
            return self
        await self._install_declared_tools()
        modules: list[ToolSetSource] = [m for m in builtin_modules(self.config) if not m.endswith(".guides")]
        if self.kit.long_term is not None:
            modules.append("rockbot.agent.toolsets.long_term_memory")
        modules += self._tool_sets
        modules += [m for m in builtin_modules(self.config) if m.endswith(".guides")]
        await install_tool_sets(registry=self.registry, kit=self.kit, modules=modules)
        await self.recorder.start()
        self.ready = True
        log.info("agent %s/%s ready with %d tools", self.config.namespace, self.config.name, len(self.registry))
        return self

    @property
    def notices(self) -> list[str]:
        """What went wrong while installing tools (an MCP server that failed or is still starting), for whoever
        started the agent; the log has the details."""
        return self.kit.notices

    async def close(self) -> None:
        await self.recorder.close()
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
        parent_run_id: str | None = None,
        recorded: HistoryReply | None = None,
        replay: Replay | None = None,
        prior: list[dict[str, Any]] | None = None,
        run_id: str | None = None,
    ) -> ChatResult:
        """One user turn in `caller`'s kept conversation `session_id`; turns of one conversation run in order.

        The conversation and its working memory are `caller`'s alone (see `ConversationKey`): another
        caller using the same session id talks in a conversation of its own. `source` (the inbox
        request's kind) and `request_id` label the turn's span and metrics. `recorded`: the session's
        recorded conversation as the console sent it with the turn (it is then not asked for). `replay`: the turn
        replays a recorded run (the console's word: see `Replay`), recorded as a run of source `replay` whose parent
        is the run replayed. `prior`: the conversation an evaluation case starts from, instead of any kept one.
        `run_id`: the turn's run id when chosen before it (`new_run_id`: an A2A turn's files are kept with it first).
        """
        key = self.conversation(caller=caller, session_id=session_id).id
        async with self.conversations.lock(key):
            recalled = self._auto_recall(caller=caller, text=text)  # meanwhile the history is read
            try:
                history = list(prior) if prior is not None else await self._history(
                    key=key, caller=caller, session_id=session_id, recorded=recorded)
                history.append({"role": "user", "content": text})
                try:
                    return await self._turn(
                        history=history, session_id=key, call_chain=call_chain, on_event=on_event,
                        source=source, request_id=request_id, caller=caller, session=session_id,
                        new_from=len(history) - 1, parent_run_id=parent_run_id, replay=replay, recalled=recalled,
                        run_id=run_id,
                    )  # fmt: skip
                finally:
                    self.conversations.save(key, _complete_turns(history))
            finally:
                if recalled is not None:
                    recalled.cancel()

    async def _history(self, *, key: str, caller: str, session_id: str,
                       recorded: HistoryReply | None) -> list[dict[str, Any]]:
        """The conversation so far: as recorded (every replica's turns, an earlier pod's; sent with the turn, else
        asked of the store) when the store answers in time and holds this process's last turn of it, else as this
        process holds it."""
        held = self.conversations.history(key)
        if self.recorder.record != "Full" or (recorded is None and self.history is None):
            return held
        if recorded is None:
            assert self.history is not None
            recorded = await self.history.fetch(caller=caller, session_id=session_id,
                                                max_messages=self.conversations.max_messages)  # fmt: skip
        if recorded is None or not recorded.messages:
            return held
        last = self._last_runs.get(key)
        if last is not None and last not in recorded.run_ids:
            return held
        return trimmed(list(recorded.messages), self.conversations.max_messages)

    async def _recall(self, *, session_key: str, key: str) -> str | None:
        """A working-memory chunk of the conversation that this process does not hold, from the store (another
        replica's turn, an earlier pod's), or None."""
        if self.history is None or self.recorder.record != "Full":
            return None
        conversation = ConversationKey.from_id(session_key)
        reply = await self.history.memory(caller=conversation.caller, session_id=conversation.session_id, key=key)
        if reply is None or reply.memory is None:
            return None
        return reply.memory + (f"\n[{reply.memory_cut} more characters of this chunk were not kept]"
                               if reply.memory_cut else "")  # fmt: skip

    async def complete(
        self, messages: list[dict[str, Any]], *, session_id: str, on_event: EventSink | None = None
    ) -> ChatResult:
        """One turn over a history the caller keeps (OpenAI semantics); nothing is stored but working memory,
        kept as the endpoint's (`HTTP_CALLER`), apart from any bus caller's."""
        key = self.conversation(caller=HTTP_CALLER, session_id=session_id).id
        last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=0)
        return await self._turn(history=list(messages), session_id=key, on_event=on_event, source="http",
                                caller=HTTP_CALLER, session=session_id, new_from=last_user)  # fmt: skip

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
        caller: str = "",
        session: str = "",
        new_from: int = 0,
        parent_run_id: str | None = None,
        replay: Replay | None = None,
        recalled: asyncio.Task[list[dict[str, Any]]] | None = None,
        run_id: str | None = None,
    ) -> ChatResult:
        """Run the loop in the turn's span and its recorded run (`history[new_from:]` are the turn's messages), and
        count the turn by its outcome. `recalled`: the automatic recall, started already (else started here)."""
        with tracer.start_as_current_span(f"invoke_agent {self.config.name}"):
            if replay is not None:
                source, parent_run_id = "replay", replay.of_run
            async with self.recorder.run(source=source, session_id=session, caller=caller,
                                         model=(replay and replay.model) or self.config.model.name,
                                         request_id=request_id or "", parent_run_id=parent_run_id,
                                         run_id=run_id) as run:
                await self._recall_into(history, caller=caller, recalled=recalled)
                try:
                    result = await self._traced_turn(history=history, session_id=session_id, source=source,
                                                     on_event=on_event, call_chain=call_chain, request_id=request_id,
                                                     replay=replay)
                except BudgetExhausted as exc:
                    run.ended(outcome="Refused", error=str(exc))
                    raise
                finally:
                    run.messages(history[new_from:])
                run.ended(outcome="Succeeded" if not result.hit_iteration_limit and not result.budget_exhausted
                          else "Failed", error=_outcome(result) if result.hit_iteration_limit else "")
                self._last_runs[session_id] = run.run_id
                if self.recorder.record != "None":
                    result.run_id = run.run_id
                return result

    async def _recall_into(self, history: list[dict[str, Any]], *, caller: str,
                           recalled: asyncio.Task[list[dict[str, Any]]] | None) -> None:  # fmt: skip
        """Put the caller's most relevant long-term memories after their message, when the Agent asks for it."""
        if self.kit.long_term is not None and caller:
            self.kit.long_term.prepare(caller)
        if recalled is None and history and history[-1].get("role") == "user":
            content = history[-1].get("content")
            if isinstance(content, list):  # an OpenAI client's parts: their text
                content = " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
            recalled = self._auto_recall(caller=caller, text=str(content or ""))
        if recalled is not None:
            history.extend(await recalled)
        elif self.kit.long_term is not None and caller:  # what was refused after the model was told it is kept
            history.extend(self.kit.long_term.refusal_messages(caller))

    def _auto_recall(self, *, caller: str, text: str) -> asyncio.Task[list[dict[str, Any]]] | None:
        """The automatic recall for a turn saying `text`, started (so it runs while the rest of the turn is made
        ready), or None when the Agent does not ask for it."""
        memory = self.kit.long_term
        if memory is None or memory.config.auto_recall is None or not caller or not text:
            return None
        return asyncio.create_task(memory.auto_recall(caller=caller, text=text))

    async def _traced_turn(
        self,
        *,
        history: list[dict[str, Any]],
        session_id: str,
        source: str,
        on_event: EventSink | None,
        call_chain: tuple[str, ...],
        request_id: str | None,
        replay: Replay | None = None,
    ) -> ChatResult:
        outcome, result = "failed", None
        span = trace.get_current_span()
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
                history=history, session_id=session_id, call_chain=call_chain, on_event=on_event, replay=replay
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
            elif isinstance(backend, A2ABackend):
                executor = a2a_tool(resolved, kit=self.kit)
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


def _long_term_memory(config: AgentConfig, *, env: Mapping[str, str], desk: MemoryDesk | None,
                      redact: Redactor) -> LongTermMemory | None:  # fmt: skip
    """The agent's long-term memory when its config enables it (embedded with its endpoint, kept by `desk`)."""
    memory = config.long_term_memory
    if memory is None:
        return None
    embeddings = memory.embeddings
    embedder = Embedder(base_url=embeddings.base_url, model=embeddings.model,
                        api_key=env.get(embeddings.api_key.env) if embeddings.api_key else None,
                        timeout_seconds=embeddings.timeout_seconds)  # fmt: skip
    return LongTermMemory(config=memory, embedder=embedder, desk=desk, redact=redact)


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
