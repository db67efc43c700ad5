"""Pure builders: script pods (made for one job, or warm in the pool) and the patch that claims one.

Every pod is built to pass Pod Security `restricted` and to have nothing to reach or use: no
service-account token, no service links, non-root, read-only root filesystem with a size-limited
emptyDir at /tmp, all capabilities dropped, RuntimeDefault seccomp, no privilege escalation,
requests equal to limits, `restartPolicy: Never`, and the `rockbot.dev/sandbox: script` label
that the chart's default-deny NetworkPolicy (no ingress, no egress) selects.

A pod carries no job: its only process is the runner (runner.py, on the command line), which waits
for one job on its stdin (`stdin`, `stdinOnce`). The manager attaches and writes it, so a script and
its input never reach etcd, and a warm pod is the same pod a cold start makes, only made earlier.
"""

from __future__ import annotations

import hashlib
import math
import secrets
from datetime import UTC, datetime, timedelta
from importlib.resources import files
from typing import Any

from rockbot.kube.security import restricted_container_context, restricted_pod_context
from rockbot.scripts_manager.backends import ScriptJob
from rockbot.scripts_manager.settings import PoolClass, ScriptsManagerSettings

K8sObject = dict[str, Any]

CONTAINER = "script"
#: `nobody`: script pods run as a user that owns nothing in the image.
NOBODY = 65534
#: The labels every script pod carries; the sweeper and the NetworkPolicy select on them.
SANDBOX_LABELS = {"app.kubernetes.io/managed-by": "rockbot-scripts-manager", "rockbot.dev/sandbox": "script"}
SANDBOX_SELECTOR = ",".join(f"{key}={value}" for key, value in SANDBOX_LABELS.items())
#: A warm pod's limits class, the manager that keeps it, and whether a job has claimed it.
POOL_LABEL = "rockbot.dev/pool"
OWNER_LABEL = "rockbot.dev/pool-owner"
STATE_LABEL = "rockbot.dev/state"
IDLE, CLAIMED = "idle", "claimed"
POOL_SELECTOR = f"{SANDBOX_SELECTOR},{POOL_LABEL}"
#: When the pod is certainly finished (a job's pod), or when its keeper's lease ends (an idle warm
#: pod, renewed while its manager lives): the sweeper deletes pods past it plus a grace.
DEADLINE_ANNOTATION = "rockbot.dev/deadline"
REQUEST_ANNOTATION = "rockbot.dev/request-id"
#: Seconds a pod may live past the script's timeout before the kubelet stops it (the runner stops
#: the script itself at the timeout, and reports what it printed so far).
DEADLINE_SLACK_SECONDS = 10
# activeDeadlineSeconds is *not* the script's timeout: Kubernetes counts it from the pod's start,
# before scheduling and the image pull, so a cold pull would eat the script's time. A pod made for a
# job gets start-up allowance ROCKBOT_SCRIPTS_POD_START_SECONDS + timeout + slack; a warm pod gets its
# idle lifetime, lowered at the claim to its age + timeout + slack (the API allows lowering only).
# The runner enforces the timeout on the script itself; the deadline is the kubelet's backstop.
RUNNER = files("rockbot.scripts_manager").joinpath("runner.py").read_text()


def pod_name(job: ScriptJob) -> str:
    digest = hashlib.sha256(job.request_id.encode()).hexdigest()[:10]
    return f"rockbot-script-{digest}-{secrets.token_hex(3)}"


def job_deadline_seconds(*, job: ScriptJob, settings: ScriptsManagerSettings) -> int:
    """A cold pod's lifetime cap: start-up allowance, the script's timeout and slack (see above)."""
    return math.ceil(settings.scripts_pod_start_seconds + job.timeout_seconds) + DEADLINE_SLACK_SECONDS


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
            "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
        }],
        "volumes": [{"name": "tmp", "emptyDir": {"sizeLimit": settings.scripts_tmp_size}}],
    }  # fmt: skip
    if settings.scripts_runtime_class:
        spec["runtimeClassName"] = settings.scripts_runtime_class
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


def job_pod(*, job: ScriptJob, settings: ScriptsManagerSettings, now: datetime) -> K8sObject:
    """A pod made for one job (the cold path)."""
    seconds = job_deadline_seconds(job=job, settings=settings)
    return build_pod(
        name=pod_name(job), cpu=job.cpu or settings.scripts_cpu, memory=job.memory or settings.scripts_memory,
        settings=settings, active_deadline_seconds=seconds, labels={STATE_LABEL: CLAIMED},
        annotations={DEADLINE_ANNOTATION: (now + timedelta(seconds=seconds)).isoformat(),
                     REQUEST_ANNOTATION: job.request_id},
    )  # fmt: skip


def pool_pod(*, pool: PoolClass, owner: str, settings: ScriptsManagerSettings, now: datetime) -> K8sObject:
    """An idle warm pod of a limits class, kept by the manager `owner` (its lease ends at the deadline)."""
    return build_pod(
        name=f"rockbot-script-warm-{secrets.token_hex(5)}", cpu=pool.cpu, memory=pool.memory, settings=settings,
        active_deadline_seconds=math.ceil(settings.scripts_pool_pod_lifetime_seconds),
        labels={POOL_LABEL: pool.label, OWNER_LABEL: owner, STATE_LABEL: IDLE},
        annotations={DEADLINE_ANNOTATION: lease_end(settings=settings, now=now)},
    )  # fmt: skip


def lease_end(*, settings: ScriptsManagerSettings, now: datetime) -> str:
    return (now + timedelta(seconds=settings.scripts_pool_lease_seconds)).isoformat()


def claim_patch(*, pod: K8sObject, job: ScriptJob, now: datetime) -> list[K8sObject] | None:
    """The conditional write (a JSON patch) that makes an idle warm pod this job's, or None if the pod cannot fit it.

    Conditional on the pod still being idle with the deadline seen, so of two managers claiming one pod, one gets
    422 (its test fails); not on the resourceVersion seen, which every lease renewal and status write moves on (a
    claim lost to those sent the job to a cold pod). It also brings the deadline down to the pod's age plus the
    job's own bound.
    """
    started = (pod.get("status") or {}).get("startTime")
    current = (pod.get("spec") or {}).get("activeDeadlineSeconds")
    if not started or current is None:
        return None
    age = (now - datetime.fromisoformat(started.replace("Z", "+00:00"))).total_seconds()
    deadline = math.ceil(max(age, 0) + job.timeout_seconds) + DEADLINE_SLACK_SECONDS
    if deadline > current:  # too old for this job: the API never raises a deadline
        return None
    label, annotation = f"/metadata/labels/{json_pointer(STATE_LABEL)}", "/metadata/annotations/{}"
    return [
        {"op": "test", "path": label, "value": IDLE},
        {"op": "test", "path": "/spec/activeDeadlineSeconds", "value": current},
        {"op": "replace", "path": label, "value": CLAIMED},
        {"op": "add", "path": annotation.format(json_pointer(DEADLINE_ANNOTATION)),
         "value": (now + timedelta(seconds=deadline - age)).isoformat()},
        {"op": "add", "path": annotation.format(json_pointer(REQUEST_ANNOTATION)), "value": job.request_id},
        {"op": "replace", "path": "/spec/activeDeadlineSeconds", "value": deadline},
    ]


def json_pointer(key: str) -> str:
    """A map key as a JSON Pointer token (RFC 6901)."""
    return key.replace("~", "~0").replace("/", "~1")


def now_utc() -> datetime:
    return datetime.now(UTC)
