"""Pure builders: script pods (made for one job, or warm in the pool) and the patch that claims one.

Every pod is built to pass Pod Security `restricted` and to have nothing to reach or use: no
service-account token, no service links, non-root, read-only root filesystem with size-limited
emptyDirs at /tmp, /input (the conversation's files, which the runner writes read-only before the
script starts) and /output (what the script gives back), all capabilities dropped, RuntimeDefault
seccomp, no privilege escalation, requests equal to limits, `restartPolicy: Never`, and the
`rockbot.dev/sandbox: script` label that the chart's default-deny NetworkPolicy (no ingress, no egress)
selects.

A pod carries no job: its only process is the runner (runner.py, on the command line), which waits
for one job on its stdin (`stdin`, `stdinOnce`). The manager attaches and writes it, so a script and
its input never reach etcd, and a warm pod is the same pod a cold start makes, only made earlier.

Every pod is marked with the manager instance answerable for it (`MANAGER_LABEL`: the keeper of an idle
warm pod, the maker or claimer of a job's), and a job's pod with who waits for its answer (`ASKER_ANNOTATION`:
the sender's broker user, its reply queue and correlation id) and the request it runs (`REQUEST_LABEL`, a
digest of sender and request id). Only the scripts-manager may write pods in the scripts namespace (agents
have no Kubernetes rights; script pods no token), so a mark cannot be forged: when the instance dies, whoever
is alive answers the job from it (reaping.py).
"""

from __future__ import annotations

import hashlib
import math
import secrets
from datetime import UTC, datetime, timedelta
from importlib.resources import files
from typing import Any

from rockbot.contracts.scripts import INPUT_DIR, OUTPUT_DIR
from rockbot.kube.security import restricted_container_context, restricted_pod_context
from rockbot.scripts_manager.backends import Asker, ScriptJob
from rockbot.scripts_manager.input_files import MAX_INPUT_BYTES
from rockbot.scripts_manager.settings import PoolClass, ScriptsManagerSettings

K8sObject = dict[str, Any]

CONTAINER = "script"
#: The emptyDir of the conversation's files: as much as one call may name (input_files.py).
INPUT_SIZE = f"{MAX_INPUT_BYTES // (1024 * 1024)}Mi"
#: `nobody`: script pods run as a user that owns nothing in the image.
NOBODY = 65534
#: The labels every script pod carries; the sweeper and the NetworkPolicy select on them.
SANDBOX_LABELS = {"app.kubernetes.io/managed-by": "rockbot-scripts-manager", "rockbot.dev/sandbox": "script"}
SANDBOX_SELECTOR = ",".join(f"{key}={value}" for key, value in SANDBOX_LABELS.items())
#: A warm pod's limits class, and whether a job has claimed it (a job's pod is claimed from the start).
POOL_LABEL = "rockbot.dev/pool"
STATE_LABEL = "rockbot.dev/state"
IDLE, CLAIMED = "idle", "claimed"
POOL_SELECTOR = f"{SANDBOX_SELECTOR},{POOL_LABEL}"
#: The manager instance answerable for the pod (its Lease's holderIdentity, see reaping.py).
MANAGER_LABEL = "rockbot.dev/manager"
#: The request a job's pod runs (`request_key`), and who waits for its answer (an `Asker` as JSON).
REQUEST_LABEL = "rockbot.dev/request"
ASKER_ANNOTATION = "rockbot.dev/asker"
REQUEST_ANNOTATION = "rockbot.dev/request-id"
#: A session pod's conversation (`session_key`): another manager finds, and ends, a session it does not hold.
SESSION_LABEL = "rockbot.dev/session"
#: When the pod is certainly finished; the sweeper deletes a pod of no known manager past it plus a grace.
DEADLINE_ANNOTATION = "rockbot.dev/deadline"
#: Seconds a pod may live past the script's timeout before the kubelet stops it (the runner stops
#: the script itself at the timeout, and reports what it printed so far).
DEADLINE_SLACK_SECONDS = 10
# activeDeadlineSeconds is *not* the script's timeout: Kubernetes counts it from the pod's start,
# before scheduling and the image pull, so a cold pull would eat the script's time. A pod made for a
# job gets start-up allowance ROCKBOT_SCRIPTS_POD_START_SECONDS + timeout + slack; a warm pod gets its
# idle lifetime, lowered at the claim to its age + timeout + slack (the API allows lowering only).
# The runner enforces the timeout on the script itself; the deadline is the kubelet's backstop.
#: The code a pod's runner and a session's kernel share: the reading of /output (output_walk.py) and the writing of
#: /input (input_write.py), which the command puts before the runner's own source (and sessions.KERNEL before the
#: kernel's).
SANDBOX_FILES = "\n".join(files("rockbot.scripts_manager").joinpath(name).read_text()
                          for name in ("output_walk.py", "input_write.py"))
RUNNER = SANDBOX_FILES + "\n" + files("rockbot.scripts_manager").joinpath("runner.py").read_text()


def pod_name(job: ScriptJob) -> str:
    digest = hashlib.sha256(job.request_id.encode()).hexdigest()[:10]
    return f"rockbot-script-{digest}-{secrets.token_hex(3)}"


def job_bound(job: ScriptJob) -> float:
    """How long a job's pod must live once running: its script's timeout, or a session's maxSeconds."""
    return job.timeout_seconds if job.session is None else max(job.session.max_seconds, job.timeout_seconds)


def job_deadline_seconds(*, job: ScriptJob, settings: ScriptsManagerSettings) -> int:
    """A cold pod's lifetime cap: start-up allowance, the script's timeout (a session's life) and slack (see above)."""
    return math.ceil(settings.scripts_pod_start_seconds + job_bound(job)) + DEADLINE_SLACK_SECONDS


def build_pod(
    *,
    name: str,
    cpu: str,
    memory: str,
    settings: ScriptsManagerSettings,
    active_deadline_seconds: int,
    labels: dict[str, str],
    annotations: dict[str, str],
) -> K8sObject:
    resources = {"cpu": cpu, "memory": memory, "ephemeral-storage": settings.scripts_ephemeral_storage}
    spec: K8sObject = {
        "restartPolicy": "Never",
        "activeDeadlineSeconds": active_deadline_seconds,
        "terminationGracePeriodSeconds": 1,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": restricted_pod_context(uid=NOBODY),
        "containers": [{
            "name": CONTAINER,
            "image": settings.scripts_image,
            "imagePullPolicy": settings.scripts_image_pull_policy,
            "command": ["python3", "-I", "-S", "-c", RUNNER],  # -S: the runner needs no site-packages
            "workingDir": "/tmp",
            "stdin": True,
            "stdinOnce": True,
            "resources": {"requests": resources, "limits": resources},
            "securityContext": restricted_container_context(),
            "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}, {"name": "input", "mountPath": INPUT_DIR},
                             {"name": "output", "mountPath": OUTPUT_DIR}],
        }],
        "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": settings.scripts_tmp_size}},
                    {"name": "input", "emptyDir": {"sizeLimit": INPUT_SIZE}},
                    {"name": "output", "emptyDir": {"sizeLimit": settings.scripts_tmp_size}}],
    }  # fmt: skip
    if settings.scripts_runtime_class:
        spec["runtimeClassName"] = settings.scripts_runtime_class
    if settings.scripts_priority_class:
        spec["priorityClassName"] = settings.scripts_priority_class
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": settings.scripts_namespace,
            "labels": {**SANDBOX_LABELS, **labels},
            "annotations": annotations,
        },
        "spec": spec,
    }


def request_key(*, user: str, request_id: str) -> str:
    """A request as a label value: sender and request id together (another agent's same id is another request)."""
    return hashlib.sha256(f"{user}\0{request_id}".encode()).hexdigest()[:40]


def session_key(key: str) -> str:
    """A session's key (sender and conversation digest) as a label value."""
    return hashlib.sha256(f"session\0{key}".encode()).hexdigest()[:40]


def job_marks(job: ScriptJob, *, manager: str) -> tuple[dict[str, str], dict[str, str]]:
    """The labels and annotations that make a pod `job`'s, answerable by the instance `manager`."""
    labels = {STATE_LABEL: CLAIMED, MANAGER_LABEL: manager, **call_marks(job)[0]}
    if job.session is not None:
        labels[SESSION_LABEL] = session_key(job.session.key)
    return labels, call_marks(job)[1]


def call_marks(job: ScriptJob) -> tuple[dict[str, str], dict[str, str]]:
    """The marks of the request a pod runs now (a session pod's change with each call): its key, who waits."""
    labels, annotations = {}, {REQUEST_ANNOTATION: job.request_id}
    if job.asker is not None:
        labels[REQUEST_LABEL] = request_key(user=job.asker.user, request_id=job.request_id)
        annotations[ASKER_ANNOTATION] = job.asker.model_dump_json()
    return labels, annotations


def call_marks_patch(job: ScriptJob | None) -> K8sObject:
    """A merge patch marking a session pod with the call it runs now, or (None) with no call: between calls nobody
    waits on it, so a reaper answers nobody."""
    if job is None:
        return {"metadata": {"labels": {REQUEST_LABEL: None},
                             "annotations": {REQUEST_ANNOTATION: None, ASKER_ANNOTATION: None}}}
    labels, annotations = call_marks(job)
    return {"metadata": {"labels": labels, "annotations": annotations}}


def asker_of(pod: K8sObject) -> Asker | None:
    """Who waits for the answer of the job on `pod` (None: nobody, an idle pod, or the manager's own canary)."""
    text = (pod["metadata"].get("annotations") or {}).get(ASKER_ANNOTATION)
    try:
        return Asker.model_validate_json(text) if text else None
    except ValueError:
        return None


def ended(pod: K8sObject) -> bool:
    """The pod ended (Succeeded, or Failed: an error, its deadline), or its container did (a moment before)."""
    status = pod.get("status") or {}
    if status.get("phase") in ("Succeeded", "Failed"):
        return True
    return any((s.get("state") or {}).get("terminated") for s in status.get("containerStatuses") or [])


def job_pod(*, job: ScriptJob, settings: ScriptsManagerSettings, now: datetime, manager: str) -> K8sObject:
    """A pod made for one job (the cold path), by the instance `manager`."""
    seconds = job_deadline_seconds(job=job, settings=settings)
    labels, annotations = job_marks(job, manager=manager)
    return build_pod(
        name=pod_name(job), cpu=job.cpu or settings.scripts_cpu, memory=job.memory or settings.scripts_memory,
        settings=settings, active_deadline_seconds=seconds, labels=labels,
        annotations={DEADLINE_ANNOTATION: (now + timedelta(seconds=seconds)).isoformat(), **annotations},
    )  # fmt: skip


def pool_pod(*, pool: PoolClass, owner: str, settings: ScriptsManagerSettings, now: datetime) -> K8sObject:
    """An idle warm pod of a limits class, kept by the manager instance `owner` while its Lease lives."""
    seconds = math.ceil(settings.scripts_pool_pod_lifetime_seconds)
    return build_pod(
        name=f"rockbot-script-warm-{secrets.token_hex(5)}", cpu=pool.cpu, memory=pool.memory, settings=settings,
        active_deadline_seconds=seconds, labels={POOL_LABEL: pool.label, MANAGER_LABEL: owner, STATE_LABEL: IDLE},
        annotations={DEADLINE_ANNOTATION: (now + timedelta(seconds=seconds)).isoformat()},
    )  # fmt: skip


def claim_patch(*, pod: K8sObject, job: ScriptJob, now: datetime, manager: str) -> list[K8sObject] | None:
    """The conditional write (a JSON patch) that makes an idle warm pod this job's, or None if the pod cannot fit it.

    Conditional on the pod still being idle with the deadline seen, so of two managers claiming one pod, one gets
    422 (its test fails); not on the resourceVersion seen, which every lease renewal and status write moves on (a
    claim lost to those sent the job to a cold pod). It also brings the deadline down to the pod's age plus the
    job's own bound, and marks the pod as the job's, answerable by the claiming instance `manager`.
    """
    started = (pod.get("status") or {}).get("startTime")
    current = (pod.get("spec") or {}).get("activeDeadlineSeconds")
    if not started or current is None:
        return None
    age = (now - datetime.fromisoformat(started.replace("Z", "+00:00"))).total_seconds()
    deadline = math.ceil(max(age, 0) + job.timeout_seconds) + DEADLINE_SLACK_SECONDS
    if deadline > current:  # too old for this job: the API never raises a deadline
        return None
    # A session keeps the pod up to its maxSeconds, or for what the pod has left (it ends earlier then, and says so).
    deadline = min(math.ceil(max(age, 0) + job_bound(job)) + DEADLINE_SLACK_SECONDS, current)
    state = f"/metadata/labels/{json_pointer(STATE_LABEL)}"
    labels, annotations = job_marks(job, manager=manager)
    annotations[DEADLINE_ANNOTATION] = (now + timedelta(seconds=deadline - age)).isoformat()
    return [
        {"op": "test", "path": state, "value": IDLE},
        {"op": "test", "path": "/spec/activeDeadlineSeconds", "value": current},
        *({"op": "add", "path": f"/metadata/labels/{json_pointer(key)}", "value": value}
          for key, value in labels.items()),  # `add` replaces a label that is there (the state, the keeper)
        *({"op": "add", "path": f"/metadata/annotations/{json_pointer(key)}", "value": value}
          for key, value in annotations.items()),
        {"op": "replace", "path": "/spec/activeDeadlineSeconds", "value": deadline},
    ]


def json_pointer(key: str) -> str:
    """A map key as a JSON Pointer token (RFC 6901)."""
    return key.replace("~", "~0").replace("/", "~1")


def now_utc() -> datetime:
    return datetime.now(UTC)
