"""`execute_python_script` for the agent: ask the scripts-manager over the bus, get the answer as data.

The agent never runs scripts and has no Kubernetes rights; it publishes a `ScriptInvokeRequest`
on `script.invoke` and waits on its process's own reply queue (`Bus.own_replies`, one the broker
lets only this process consume), so replicas of one agent, and same-named agents in other
namespaces, never take each other's answers.

The wait has two steps (`Bus.request` with `accept_within_seconds`). A scripts-manager says when it takes the
script, right before it claims or makes its sandbox, and how soon it answers; with no such word within
`accept_within_seconds` (no manager runs, or every one is busy) the call fails, retryable, and no manager
starts the script later (service.py). After the word the call waits the script's timeout plus the start-up bound the
manager gave, never more than `start_ceiling_seconds` on top of the timeout: only the scripts-manager's word
counts (the broker checks `user_id`). A manager that dies after taking the script is answered for by whoever
cleans up after it (its Lease, seconds later), so no call waits on a manager that is gone. An older manager,
which never says, is heard when its answer comes within the first step. Whatever happens, the
caller gets a `ScriptInvokeResponse` (the script ran) or a `ScriptInvokeError` (it could not run,
or no answer came in time) — never an exception — so the tool loop can hand it to the model.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from typing import Any

from pydantic import ValidationError

from rockbot.agent.file_keeping import BusFileKeeper, FileKeeper, input_files, keep_artifacts, output_files
from rockbot.agent.recording import current_run
from rockbot.bus import SCRIPTS_MANAGER, BadMessage, Bus, BusError, BusUnavailable, NotAccepted, RequestTimeout
from rockbot.bus.interface import ACCEPT_TRAVEL_SECONDS
from rockbot.bus.topology import SCRIPT_INVOKE
from rockbot.contracts.agent_config import AgentConfig
from rockbot.contracts.errors import ErrorCode, ErrorInfo
from rockbot.contracts.scripts import (
    SCRIPT_INVOKE_REPLY,
    ScriptInvokeError,
    ScriptInvokeRequest,
    ScriptInvokeResponse,
)

DEFAULT_TIMEOUT_SECONDS = 30.0
#: How long a script waits in the queue, and for a free sandbox, before a scripts-manager must have taken it.
DEFAULT_ACCEPT_WITHIN_SECONDS = 15.0
#: The most a manager's word may add to the script's own timeout for start-up and answer (its pod start bound).
DEFAULT_START_CEILING_SECONDS = 150.0
#: The longest a call waits on top of the script's own timeout.
LONGEST_EXTRA_SECONDS = DEFAULT_ACCEPT_WITHIN_SECONDS + ACCEPT_TRAVEL_SECONDS + DEFAULT_START_CEILING_SECONDS


class ScriptSandbox:
    def __init__(
        self,
        *,
        bus: Bus,
        namespace: str,
        agent: str,
        default_timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS,
        accept_within_seconds: float = DEFAULT_ACCEPT_WITHIN_SECONDS,
        start_ceiling_seconds: float = DEFAULT_START_CEILING_SECONDS,
        cpu: str | None = None,
        memory: str | None = None,
        keeper: FileKeeper | None = None,
    ) -> None:
        self._bus = bus
        #: Where this agent's conversation files are kept (a person's A2A files among them); None: nowhere.
        self.keeper = keeper
        self._agent = agent
        self._cpu = cpu
        self._memory = memory
        self._default_timeout = default_timeout_seconds
        self._accept_within = accept_within_seconds
        self._start_ceiling = start_ceiling_seconds

    @classmethod
    def for_agent(cls, *, bus: Bus, config: AgentConfig, keeper: FileKeeper | None = None) -> ScriptSandbox:
        """The client of an agent process: its scripts run with its `spec.scriptLimits`; their artifacts are kept by
        `keeper` (default: the console, over the bus)."""
        limits = config.script_limits
        return cls(bus=bus, namespace=config.namespace, agent=config.name,
                   default_timeout_seconds=limits.timeout_seconds, cpu=limits.cpu, memory=limits.memory,
                   keeper=keeper or BusFileKeeper(bus=bus))  # fmt: skip

    async def execute_python_script(
        self,
        *,
        script: str,
        input_data: Any = None,
        timeout_seconds: float | None = None,
        pip_packages: list[str] | None = None,
        request_id: str | None = None,
        session: str | None = None,
    ) -> ScriptInvokeResponse | ScriptInvokeError:
        """Run `script` in a network-less sandbox; `input_data` arrives on its stdin (JSON unless a string).

        `request_id` should be the tool-call id, so a retried delivery is recognised and not run twice;
        `session` names the conversation's sandbox when the Agent keeps one per conversation (`session_digest`).
        """
        request_id = request_id or f"script-{uuid.uuid4().hex}"
        run = current_run()
        try:
            request = ScriptInvokeRequest(
                request_id=request_id,
                agent=self._agent,
                script=script,
                input_data=input_data if input_data is None or isinstance(input_data, str) else json.dumps(input_data),
                timeout_seconds=self._default_timeout if timeout_seconds is None else timeout_seconds,
                pip_packages=tuple(pip_packages or ()),
                cpu=self._cpu,
                memory=self._memory,
                session=session,
                input_files=await input_files(run, keeper=self.keeper),
                output_files=output_files(run, keeper=self.keeper),
            )
        except (ValidationError, TypeError) as exc:
            return _error(request_id, ErrorCode.INVALID_ARGUMENTS, _describe(exc))
        wait = request.timeout_seconds + self._start_ceiling
        try:
            reply = await self._bus.request(
                queue=SCRIPT_INVOKE,
                body=request,
                reply_queue=await self._bus.own_replies(),
                correlation_id=request_id,
                timeout_seconds=wait,
                responder=SCRIPTS_MANAGER,
                accept_within_seconds=self._accept_within,
            )
            answer = reply.decode(SCRIPT_INVOKE_REPLY)
            if isinstance(answer, ScriptInvokeResponse):
                answer = await keep_artifacts(answer, run=run, keeper=self.keeper)
            if isinstance(answer, ScriptInvokeResponse) and run is not None:
                run.recorder.observe_script(
                    call_id=request_id, exit_code=answer.exit_code, stdout=answer.stdout, stderr=answer.stderr,
                    duration_seconds=answer.duration_seconds, backend=answer.backend, pod=answer.pod,
                )
            return answer
        except NotAccepted:
            return _error(
                request_id, ErrorCode.UNAVAILABLE,
                f"no scripts-manager took the script within {self._accept_within:g} s: none runs, every one is "
                "busy, or it is still starting (proving its sandbox's isolation); it did not run — try again shortly",
                retryable=True,
            )  # fmt: skip
        except RequestTimeout:
            return _error(
                request_id, ErrorCode.TIMEOUT,
                "the scripts-manager took the script but gave no answer within the time it gave (at most "
                f"{wait:g} s); it may have stopped, and the script may have run in part: check what it did before "
                "you run it again",
                retryable=True,
            )  # fmt: skip
        except BusUnavailable as exc:
            return _error(request_id, ErrorCode.UNAVAILABLE, f"the message bus is unavailable: {exc}", retryable=True)
        except BadMessage as exc:
            return _error(request_id, ErrorCode.EXECUTION_FAILED, f"the scripts-manager's answer was unreadable: {exc}")
        except BusError as exc:
            return _error(request_id, ErrorCode.UNAVAILABLE, str(exc), retryable=True)


def session_digest(conversation_id: str) -> str:
    """The request's `session`: a digest of the conversation's key (agent, validated caller, session id), so the
    scripts-manager can keep a conversation's sandbox apart from every other without learning who the caller is."""
    return hashlib.sha256(conversation_id.encode()).hexdigest()[:32]


def _error(request_id: str, code: ErrorCode, message: str, *, retryable: bool = False) -> ScriptInvokeError:
    return ScriptInvokeError(request_id=request_id, error=ErrorInfo(code=code, message=message, retryable=retryable))


def _describe(exc: ValidationError | TypeError) -> str:
    if isinstance(exc, TypeError):
        return f"invalid arguments: {exc}"
    fields = {"script", "input_data", "timeout_seconds", "pip_packages", "request_id", "agent"}
    problems = [
        f"{'.'.join(str(part) for part in e['loc']) if e['loc'] and e['loc'][0] in fields else 'arguments'}: {e['msg']}"
        for e in exc.errors()[:5]
    ]
    return "invalid arguments: " + "; ".join(problems)
