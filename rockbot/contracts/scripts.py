"""Messages of `execute_python_script` between an agent and the scripts-manager.

The request travels on `script.invoke`; the answer (a `ScriptInvokeResponse` or a
`ScriptInvokeError`, told apart by `kind`) goes to the asking process's reply queue
(`agent.<namespace>.<agent>.replies.<n>`) with the request id as correlation id. A
script that overruns its timeout or memory is still a
*response* (`timed_out` / `oom_killed`, with the output it produced); an error means the script
could not be run or answered at all.

Structure is checked here; limits that depend on the deployment (size caps, timeout bounds,
allowed packages, CPU and memory maximums) are checked by the scripts-manager and answered with
an error naming the field.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from rockbot.contracts.errors import ErrorInfo

SCHEMA_VERSION = 1

#: What an agent name may look like: it names the asking agent (`agent.<namespace>.<agent>...`).
AGENT_NAME_PATTERN = r"^[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?$"
#: A positive Kubernetes quantity without exponent (`250m`, `0.5`, `128Mi`, `1G`), as an Agent's scriptLimits give it.
QUANTITY_PATTERN = r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|Ki|Mi|Gi|Ti)?$"
Quantity = Annotated[str, Field(pattern=QUANTITY_PATTERN, max_length=32)]


class ScriptInvokeRequest(BaseModel):
    """Run `script` with `input_data` on its standard input; `request_id` is the tool-call id."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: Literal[1] = SCHEMA_VERSION
    request_id: Annotated[str, Field(min_length=1, max_length=256)]
    agent: Annotated[str, Field(pattern=AGENT_NAME_PATTERN)]
    script: Annotated[str, Field(min_length=1)]
    input_data: str | None = None
    timeout_seconds: Annotated[float, Field(gt=0)] = 30.0
    pip_packages: tuple[str, ...] = ()
    #: The sandbox's CPU and memory (requests = limits). The scripts-manager runs a script with the limits of
    #: its sender's Agent (`spec.scriptLimits`, looked up by `user_id`); these, like `timeout_seconds`, may only
    #: lower them, never raise them (None: the Agent's).
    cpu: Quantity | None = None
    memory: Quantity | None = None


class ScriptInvokeResponse(BaseModel):
    """What the script did: its two output streams kept apart, and how it ended."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["result"] = "result"
    schema_version: Literal[1] = SCHEMA_VERSION
    request_id: str
    stdout: str
    stderr: str
    exit_code: int | None  # None when the script was killed before it could exit
    timed_out: bool = False
    oom_killed: bool = False
    output_truncated: bool = False
    duration_seconds: float
    #: Where it ran, for the run's record: `pods` (a script pod, named in `pod`) or `local/<isolation>`
    #: (`local/bwrap`, `local/unshare`, `local/unsafe-none`); empty from a manager that does not say.
    backend: Annotated[str, Field(max_length=64)] = ""
    pod: Annotated[str, Field(max_length=253)] = ""


class ScriptInvokeError(BaseModel):
    """The script could not be run (bad request, policy, sandbox or cluster down, no answer)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["error"] = "error"
    schema_version: Literal[1] = SCHEMA_VERSION
    request_id: str
    error: ErrorInfo


ScriptInvokeReply = Annotated[ScriptInvokeResponse | ScriptInvokeError, Field(discriminator="kind")]

#: Parses a reply body into whichever of the two it is.
SCRIPT_INVOKE_REPLY: TypeAdapter[ScriptInvokeResponse | ScriptInvokeError] = TypeAdapter(ScriptInvokeReply)
