"""Token usage an agent process reports to the operator, and the day's total the operator answers with.

An agent process sends a `UsageReport` on `operator.usage` with the tokens its model requests used
since its last report, for one UTC day; who used them is the message's sender (the broker-validated
`user_id`), never a field. The operator adds the reports of every replica of the Agent, keeps the
day's total in `Agent.status.usage` and answers each report with a `UsageTotal` on the sender's
scheduling reply queue: what the Agent used that day over all its replicas, this report included.
"""

from __future__ import annotations

import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

SCHEMA_VERSION = 1
#: The largest report read (a few numbers and a date).
MAX_REPORT_BYTES = 4096

Tokens = Annotated[int, Field(ge=0)]


class _DayTokens(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: Literal[1] = SCHEMA_VERSION
    day: datetime.date
    prompt_tokens: Tokens = 0
    completion_tokens: Tokens = 0


class UsageReport(_DayTokens):
    """Tokens one agent process used since its last report."""


class UsageTotal(_DayTokens):
    """What the Agent used that day over all its replicas."""
