"""The checks a request passes before any sandbox is touched; each failure names the field and the fix."""

from __future__ import annotations

import re

from packaging.utils import canonicalize_name

from rockbot.contracts.agent_config import ScriptLimits
from rockbot.contracts.errors import ErrorCode, ErrorInfo
from rockbot.contracts.scripts import ScriptInvokeRequest
from rockbot.scripts_manager.backends import Asker, ScriptJob, SessionTerms
from rockbot.scripts_manager.settings import ScriptsManagerSettings, cpu_millicores, quantity_bytes

#: A distribution name as PEP 508 defines it; versions, extras, URLs and markers are not accepted.
_PACKAGE_NAME = re.compile(r"^([A-Z0-9]|[A-Z0-9][A-Z0-9._-]*[A-Z0-9])$", re.IGNORECASE)


class Refused(Exception):
    """The request will not be run; `error` says why and what to change."""

    def __init__(self, error: ErrorInfo) -> None:
        super().__init__(error.message)
        self.error = error


def _invalid(message: str) -> Refused:
    return Refused(ErrorInfo(code=ErrorCode.INVALID_ARGUMENTS, message=message, retryable=False))


def check(
    *, request: ScriptInvokeRequest, limits: ScriptLimits, settings: ScriptsManagerSettings, asker: Asker | None = None
) -> ScriptJob:
    """The job to run with the asking agent's `limits`, or `Refused` with InvalidArguments (fix the request) or
    Rejected (policy). The request's own cpu, memory and timeout may lower its Agent's limits, never raise them."""
    script_bytes = len(request.script.encode())
    if script_bytes > settings.scripts_max_script_bytes:
        raise _invalid(
            f"script is {script_bytes} bytes, over the limit of {settings.scripts_max_script_bytes}: "
            "make it shorter, or pass the data it works on in input_data"
        )
    input_bytes = len((request.input_data or "").encode())
    if input_bytes > settings.scripts_max_input_bytes:
        raise _invalid(f"input_data is {input_bytes} bytes, over the limit of {settings.scripts_max_input_bytes}")
    if request.timeout_seconds > settings.scripts_max_timeout_seconds:
        raise _invalid(
            f"timeout_seconds={request.timeout_seconds:g} is over the limit of "
            f"{settings.scripts_max_timeout_seconds:g}: ask for at most that"
        )
    if len(request.pip_packages) > settings.scripts_max_packages:
        raise _invalid(f"pip_packages lists {len(request.pip_packages)}, more than {settings.scripts_max_packages}")
    for index, name in enumerate(request.pip_packages):
        if not _PACKAGE_NAME.match(name):
            raise _invalid(
                f"pip_packages[{index}]={name!r} is not a package name (PEP 508): give a bare name such as "
                "'numpy', without versions, extras or URLs"
            )
    if request.pip_packages:
        _check_allowed(packages=request.pip_packages, settings=settings)
    cpu, memory = _resources(request=request, limits=limits, settings=settings)
    return ScriptJob(
        request_id=request.request_id,
        script=request.script,
        input_data=request.input_data,
        timeout_seconds=min(request.timeout_seconds, limits.timeout_seconds),
        packages=tuple(sorted({canonicalize_name(name) for name in request.pip_packages})),
        cpu=cpu,
        memory=memory,
        output_bounds=settings.output_bounds,
        asker=asker,
        session=_session(request=request, limits=limits, asker=asker),
    )


def _session(*, request: ScriptInvokeRequest, limits: ScriptLimits, asker: Asker | None) -> SessionTerms | None:
    """The call's session: only when its sender's Agent asks for one (the request alone never opens one)."""
    terms = limits.sessions
    if request.session is None or asker is None or terms.mode != "PerConversation":
        return None
    return SessionTerms(owner=asker.user, session=request.session, idle_seconds=terms.idle_seconds,
                        max_seconds=terms.max_seconds)


#: Below these a Python interpreter cannot do anything useful; a request under them is a mistake.
_MIN_CPU_MILLICORES = 10
_MIN_MEMORY_BYTES = 32 * 2**20


def _resources(
    *, request: ScriptInvokeRequest, limits: ScriptLimits, settings: ScriptsManagerSettings
) -> tuple[str, str]:
    """The sandbox's CPU and memory: the agent's scriptLimits, or less if it asks for less; never over the maximums."""
    cpu, memory = limits.cpu, limits.memory
    if request.cpu is not None and cpu_millicores(request.cpu) < cpu_millicores(cpu):
        cpu = request.cpu
    if request.memory is not None and quantity_bytes(request.memory) < quantity_bytes(memory):
        memory = request.memory
    if cpu_millicores(cpu) > cpu_millicores(settings.scripts_max_cpu):
        raise _invalid(f"cpu={cpu} is over this scripts-manager's maximum of {settings.scripts_max_cpu} "
                       "(ROCKBOT_SCRIPTS_MAX_CPU): lower the Agent's spec.scriptLimits.cpu")
    if cpu_millicores(cpu) < _MIN_CPU_MILLICORES:
        raise _invalid(f"cpu={cpu} is under the minimum of {_MIN_CPU_MILLICORES}m: raise the Agent's "
                       "spec.scriptLimits.cpu")
    if quantity_bytes(memory) > quantity_bytes(settings.scripts_max_memory):
        raise _invalid(f"memory={memory} is over this scripts-manager's maximum of {settings.scripts_max_memory} "
                       "(ROCKBOT_SCRIPTS_MAX_MEMORY): lower the Agent's spec.scriptLimits.memory")
    if quantity_bytes(memory) < _MIN_MEMORY_BYTES:
        raise _invalid(f"memory={memory} is under the minimum of 32Mi: raise the Agent's spec.scriptLimits.memory")
    return cpu, memory


def _check_allowed(*, packages: tuple[str, ...], settings: ScriptsManagerSettings) -> None:
    allowed = {canonicalize_name(name) for name in settings.scripts_allowed_packages}
    if not allowed:
        raise Refused(ErrorInfo(
            code=ErrorCode.REJECTED,
            retryable=False,
            message=(
                "pip_packages are not enabled on this scripts-manager; run the script with the standard library "
                "only, or ask an operator to list the packages in ROCKBOT_SCRIPTS_ALLOWED_PACKAGES (with the pod "
                "backend they must also be installed in ROCKBOT_SCRIPTS_IMAGE; locally they are installed from "
                "ROCKBOT_SCRIPTS_PIP_INDEX_URL or ROCKBOT_SCRIPTS_PIP_FIND_LINKS)"
            ),
        ))  # fmt: skip
    missing = sorted({canonicalize_name(name) for name in packages} - allowed)
    if missing:
        raise Refused(ErrorInfo(
            code=ErrorCode.REJECTED,
            retryable=False,
            message=(
                f"pip_packages {', '.join(missing)} not allowed here; allowed: {', '.join(sorted(allowed))} "
                "(ROCKBOT_SCRIPTS_ALLOWED_PACKAGES)"
            ),
        ))  # fmt: skip
