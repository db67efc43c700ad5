"""Error codes shared by every edge that turns a failure into data (bus replies, tool results).

Inside a process, code raises specific exceptions; at the edge it answers with an `ErrorInfo`
so the caller (often a language model) can read what went wrong and whether trying again helps.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field


class ErrorCode(StrEnum):
    INVALID_ARGUMENTS = "InvalidArguments"  # the caller must change the request
    TIMEOUT = "Timeout"  # no answer in time; the same request may succeed later
    EXECUTION_FAILED = "ExecutionFailed"  # the work itself broke (not the script's own exit code)
    REJECTED = "Rejected"  # valid, but policy forbids it here; the message says how to enable it
    UNAVAILABLE = "Unavailable"  # a dependency (broker, cluster) is down; retry later
    TOOL_NOT_FOUND = "ToolNotFound"  # the agent was asked for a tool it does not have
    BLACKLISTED = "Blacklisted"  # the tool exists but is disabled for this agent


class ErrorInfo(BaseModel):
    """A coded, human-readable error; `retryable` tells whether the same request may succeed later."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    code: ErrorCode
    message: str = Field(min_length=1)
    retryable: bool = False
