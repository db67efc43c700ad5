"""A tool call waiting for a person, and the person's decision: what an agent and the console say on the bus.

The agent publishes an `ApprovalRequest` when a call needs approval and waits; the console shows it and
answers with an `ApprovalDecision` on the queue the request names. The agent takes a decision only from
the console's own broker login (the broker checks `user_id`), so `decided_by` is what the console
validated (the user's TokenReview), never what a browser wrote.
"""

from __future__ import annotations

import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

SCHEMA_VERSION = 1
#: The longest arguments shown to the approver; longer ones are cut (the call itself keeps them whole).
MAX_ARGUMENTS_CHARS = 65_536


class ApprovalRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: Literal[1] = SCHEMA_VERSION
    approval_id: Annotated[str, Field(min_length=1, max_length=128)]
    namespace: str
    agent: str
    session_id: str
    tool_call_id: str
    tool_name: str
    arguments: Annotated[str, Field(max_length=MAX_ARGUMENTS_CHARS + 64)]
    requested_at: datetime.datetime
    expires_at: datetime.datetime
    on_timeout: Literal["Deny", "Allow"]
    #: The queue of the agent process that waits for the decision.
    reply_to: str | None = None


class ApprovalDecision(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: Literal[1] = SCHEMA_VERSION
    approval_id: Annotated[str, Field(min_length=1, max_length=128)]
    approved: bool
    reason: Annotated[str, Field(max_length=2000)] = ""
    decided_by: Annotated[str, Field(min_length=1, max_length=512)]
    decided_at: datetime.datetime
