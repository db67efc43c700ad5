"""Messages on an agent's inbox queue (`agent.<namespace>.<name>.inbox`) and the reply it sends back.

One request model serves the five ways work reaches an agent (a user's message, a scheduled task
firing, a Trigger firing on a webhook or a Kubernetes event, another agent calling it as a tool, an
Evaluation's case) so
the agent has one handler and one reply shape.
Sub-agent calls carry the chain of agents that led to them: the receiver refuses a call that would
loop back to an agent already in the chain or go deeper than `MAX_CALL_DEPTH`.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rockbot.contracts.errors import ErrorInfo
from rockbot.contracts.recording import HistoryReply

SCHEMA_VERSION = 1

#: How many agent-to-agent hops one request may take (the user's agent is depth 0).
MAX_CALL_DEPTH = 4
#: The largest inbox request an agent reads (its prompt, escaped, and the rest); longer ones are refused unparsed.
MAX_REQUEST_BYTES = 1024 * 1024
#: The most recorded tool calls one replay carries.
MAX_REPLAYED_CALLS = 256
#: How a recorded replay's answer to a call without a recorded match starts (the timeline and the diff show it).
NOT_REPLAYED = "not run in this recorded replay"

InboxKind = Literal["user_message", "scheduled_task", "trigger", "agent_call", "evaluation"]


class PriorTurn(BaseModel):
    """A turn before an evaluation case's input, as the case's author wrote it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    role: Literal["user", "assistant"]
    content: Annotated[str, Field(min_length=1)]


class RecordedCall(BaseModel):
    """A tool call as a run recorded it: what a `recorded` replay answers a call of the same name and arguments."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Annotated[str, Field(min_length=1, max_length=256)]
    arguments: str = ""
    result: str = ""
    #: The call's error code when it failed (its `result` is then the error's message).
    error_code: str = ""


class Replay(BaseModel):
    """Run this turn again as a replay of a recorded run (`rockbot replay`): recorded with source `replay` and the
    original as its parent. `recorded` set: no tool runs, a call matching one of them (name and arguments, each
    recorded call answering once) gets its recorded result, any other is answered as not run; None: tools run.
    `model` and `system_prompt` replace the Agent's for this turn. Taken only from `service.console` (anyone else
    could make an agent believe forged tool results)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    of_run: Annotated[str, Field(min_length=1, max_length=64)]
    recorded: Annotated[list[RecordedCall], Field(max_length=MAX_REPLAYED_CALLS)] | None = None
    model: Annotated[str, Field(min_length=1, max_length=256)] | None = None
    system_prompt: str | None = None


class InboxRequest(BaseModel):
    """Work for an agent: `content` is the user turn, the task's prompt, the Trigger's rendered prompt, or the
    calling agent's instruction.

    `call_chain` lists the agents (`namespace/name`) the request passed through, caller last; its
    length is the call depth. `reply_to` is the queue the `InboxReply` goes to (correlation id =
    `request_id`); without it the agent does the work and answers nobody (fire-and-forget tasks).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: Literal[1] = SCHEMA_VERSION
    kind: InboxKind
    request_id: Annotated[str, Field(min_length=1, max_length=256)]
    session_id: Annotated[str, Field(min_length=1, max_length=256)]
    content: Annotated[str, Field(min_length=1)]
    reply_to: str | None = None
    call_chain: tuple[str, ...] = ()
    #: The calling agent's run (an agent_call's), so the run store shows the call as a child of it.
    parent_run_id: Annotated[str, Field(max_length=64)] | None = None
    #: The person a console user_message speaks for, as the console validated them (TokenReview, proxy): only
    #: `service.console` may name one (the agent refuses it from anyone else), and the run's caller is then
    #: `console:<user>` (`console_caller`), so each person's conversations are their own.
    on_behalf_of: Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[^|]+$")] | None = None
    #: Send `TurnProgress` messages (text deltas, tool calls starting and ending) to `reply_to` while the turn runs.
    progress: bool = False
    #: The session's conversation as the run store keeps it, read by the console for a person's turn so the agent
    #: need not ask `console.history` for it (a bus round trip before the model's first token): taken only from
    #: `service.console` (the agent refuses it from anyone else, whose word about a conversation is worth nothing).
    conversation: HistoryReply | None = None
    #: Replay a recorded run (`Replay`): only from `service.console`, like `on_behalf_of`.
    replay: Replay | None = None
    #: An evaluation case's conversation before `content` (the turn starts from it, not from any kept history).
    prior_turns: tuple[PriorTurn, ...] = ()
    #: An evaluation case's answers to approval-gated tools (tool name -> approved; any other gated call is
    #: denied): the turn asks nobody. Only an `evaluation` carries them, and only the evaluation runner sends one.
    approvals: dict[str, bool] | None = None

    @property
    def depth(self) -> int:
        return len(self.call_chain)

    @model_validator(mode="after")
    def _agent_calls_name_their_caller(self) -> InboxRequest:
        if self.kind == "agent_call" and not self.call_chain:
            raise ValueError("call_chain: an agent_call must list at least the calling agent ('namespace/name')")
        if self.on_behalf_of is not None and self.kind != "user_message":
            raise ValueError("on_behalf_of: only a user_message speaks for a person")
        if self.replay is not None and self.kind != "user_message":
            raise ValueError("replay: only a user_message replays a run")
        if self.conversation is not None and self.conversation.session_id != self.session_id:
            raise ValueError(f"conversation: the session {self.conversation.session_id} is not this turn's")
        if self.kind != "evaluation" and (self.prior_turns or self.approvals is not None):
            raise ValueError("prior_turns/approvals: only an evaluation case's turn carries them")
        return self


class InboxReply(BaseModel):
    """The outcome of one `InboxRequest`: the final answer, or an error as data, and the tools used."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: Literal[1] = SCHEMA_VERSION
    request_id: str
    session_id: str
    answer: str | None = None
    error: ErrorInfo | None = None
    tools_called: tuple[str, ...] = ()
    #: The turn's run in the run store (`rockbot runs show <id>`), when it was recorded.
    run_id: str | None = None
    #: What the turn's model requests used, summed (an evaluation's token bound reads them).
    prompt_tokens: int = 0
    completion_tokens: int = 0

    @model_validator(mode="after")
    def _answer_or_error(self) -> InboxReply:
        if (self.answer is None) == (self.error is None):
            raise ValueError("answer/error: a reply carries exactly one of them")
        return self
