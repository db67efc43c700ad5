"""Whose conversation it is: the one key under which an agent keeps a conversation and its working memory.

A session id alone names nothing: callers choose it and others can guess it
(`<caller>:<session>`, `scheduledtask/<ns>/<task>/<slot>-<uid8>`, `task-<name>`). A conversation
is the agent that keeps it, the principal that talks to it (the broker-validated sender of the
inbox request, `Delivery.user_id`; `HTTP_CALLER` for the bearer-token endpoint) and that principal's
session id, so two callers that pick the same session id never see each other's turns. Everything
that stores per-conversation state (the agent's history and working memory, a run store) keys it by
this model or by its `id`.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

#: The caller of the agent's OpenAI-compatible endpoint (everyone holding its bearer token is one caller).
HTTP_CALLER = "http"

_NO_BAR = r"^[^|]+$"


def console_caller(user: str) -> str:
    """The caller of a console user's turns: the person the console validated, never a bus principal's name
    (`console:` cannot start a broker user), so nobody else's conversation can be theirs."""
    return f"console:{user}"


class ConversationKey(BaseModel):
    """One conversation of one agent with one caller."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: `namespace/name` of the agent that keeps the conversation.
    agent: Annotated[str, Field(min_length=1, max_length=127, pattern=_NO_BAR)]
    #: The broker user that sent the request (`agent.<ns>.<name>`, `service.<name>`), or `HTTP_CALLER`.
    caller: Annotated[str, Field(min_length=1, max_length=255, pattern=_NO_BAR)]
    #: The session id the caller chose; meaningful only together with `caller`.
    session_id: Annotated[str, Field(min_length=1)]

    @classmethod
    def from_id(cls, key_id: str) -> ConversationKey:
        """The key an `id` names (`agent|caller|session`: the session id may hold `|`, the first two never do)."""
        agent, caller, session_id = key_id.split("|", 2)
        return cls(agent=agent, caller=caller, session_id=session_id)

    @property
    def id(self) -> str:
        """One string for the whole key (`agent|caller|session`); unambiguous: the first two hold no `|`."""
        return f"{self.agent}|{self.caller}|{self.session_id}"
