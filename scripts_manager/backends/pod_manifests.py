"""Pure builders: a `ScriptJob` in, the script pod and its ConfigMap out (no API calls here).

The pod is built to pass Pod Security `restricted` and to have nothing to reach or use: no
service-account token, no service links, non-root, read-only root filesystem with a size-limited
emptyDir at /tmp, all capabilities dropped, RuntimeDefault seccomp, no privilege escalation,
requests equal to limits, `restartPolicy: Never`, and the `rockbot.dev/sandbox: script` label
that the chart's default-deny NetworkPolicy (no ingress, no egress) selects. The script, its
input and the runner travel in a ConfigMap volume, never on a command line or in an env var.
"""

from __future__ import annotations

import hashlib
import json
import math
import uuid
from datetime import UTC, datetime, timedelta
from importlib.resources import files
from typing import Any

from rockbot.kube.security import restricted_container_context, restricted_pod_context
from rockbot.scripts_manager.backends import ScriptJob
from rockbot.scripts_manager.settings import ScriptsManagerSettings

K8sObject = dict[str, Any]

CONTAINER = "script"
#: `nobody`: script pods run as a user that owns nothing in the image.
NOBODY = 65534
JOB_MOUNT = "/rockbot"
#: The labels every script pod and ConfigMap carries; the sweeper and the NetworkPolicy select on them.
SANDBOX_LABELS = {"app.kubernetes.io/managed-by": "rockbot-scripts-manager", "rockbot.dev/sandbox": "script"}
SANDBOX_SELECTOR = ",".join(f"{key}={value}" for key, value in SANDBOX_LABELS.items())
DEADLINE_ANNOTATION = "rockbot.dev/deadline"
REQUEST_ANNOTATION = "rockbot.dev/request-id"
#: Seconds the pod may live past the script's timeout before the kubelet stops it (the runner stops
#: the script itself at the timeout, and reports what it printed so far).
DEADLINE_SLACK_SECONDS = 10
# activeDeadlineSeconds is *not* the script's timeout, though issue 3 suggested it: Kubernetes
# counts it from the pod's start, before scheduling and the image pull, so a cold pull would eat
# the script's time and a script would be reported timed out without having run. The runner
# enforces the timeout on the script itself; the pod's deadline is only the kubelet's backstop
# (start-up allowance ROCKBOT_SCRIPTS_POD_START_SECONDS + timeout + slack, the same instant as the
# sweeper's deadline annotation). A pod stopped by it before its container ran is reported as
# Unavailable (the cluster was slow), never as the script timing out.
_RUNNER = files("rockbot.scripts_manager").joinpath("runner.py").read_text()


def pod_name(job: ScriptJob) -> str:
    digest = hashlib.sha256(job.request_id.encode()).hexdigest()[:10]
    return f"rockbot-script-{digest}-{uuid.uuid4().hex[:6]}"


def active_deadline_seconds(*, job: ScriptJob, settings: ScriptsManagerSettings) -> int:
    """The pod's lifetime cap: start-up allowance, the script's timeout and slack (see above)."""
    return math.ceil(settings.scripts_pod_start_seconds + job.timeout_seconds) + DEADLINE_SLACK_SECONDS


def deadline(*, job: ScriptJob, settings: ScriptsManagerSettings, now: datetime) -> datetime:
    """When the pod is certainly finished: the kubelet stops it by then."""
    return now + timedelta(seconds=active_deadline_seconds(job=job, settings=settings))


def build_pod(*, job: ScriptJob, name: str, settings: ScriptsManagerSettings, now: datetime) -> K8sObject:
    resources = {
        "cpu": job.cpu or settings.scripts_cpu,
        "memory": job.memory or settings.scripts_memory,
        "ephemeral-storage": settings.scripts_ephemeral_storage,
    }
    spec: K8sObject = {
        "restartPolicy": "Never",
        "activeDeadlineSeconds": active_deadline_seconds(job=job, settings=settings),
        "terminationGracePeriodSeconds": 1,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": restricted_pod_context(uid=NOBODY),
        "containers": [{
            "name": CONTAINER,
            "image": settings.scripts_image,
            "imagePullPolicy": settings.scripts_image_pull_policy,
            "command": ["python3", "-I", f"{JOB_MOUNT}/runner.py", JOB_MOUNT],
            "workingDir": "/tmp",
            "resources": {"requests": resources, "limits": resources},
            "securityContext": restricted_container_context(),
            "volumeMounts": [
                {"name": "job", "mountPath": JOB_MOUNT, "readOnly": True},
                {"name": "tmp", "mountPath": "/tmp"},
            ],
        }],
        "volumes": [
            {"name": "job", "configMap": {"name": name, "defaultMode": 0o444}},
            {"name": "tmp", "emptyDir": {"sizeLimit": settings.scripts_tmp_size}},
        ],
    }  # fmt: skip
    if settings.scripts_runtime_class:
        spec["runtimeClassName"] = settings.scripts_runtime_class
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": settings.scripts_namespace,
            "labels": dict(SANDBOX_LABELS),
            "annotations": {
                DEADLINE_ANNOTATION: deadline(job=job, settings=settings, now=now).isoformat(),
                REQUEST_ANNOTATION: job.request_id,
            },
        },
        "spec": spec,
    }


def build_config_map(*, job: ScriptJob, pod: K8sObject, settings: ScriptsManagerSettings) -> K8sObject:
    """The job's files, owned by the pod so that deleting the pod deletes them too."""
    metadata = pod["metadata"]
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": metadata["name"],
            "namespace": metadata["namespace"],
            "labels": dict(SANDBOX_LABELS),
            "annotations": {DEADLINE_ANNOTATION: metadata["annotations"][DEADLINE_ANNOTATION]},
            "ownerReferences": [{
                "apiVersion": "v1", "kind": "Pod", "name": metadata["name"], "uid": metadata["uid"],
                "blockOwnerDeletion": False,
            }],
        },
        "data": {
            "script.py": job.script,
            "input": job.input_data or "",
            "runner.py": _RUNNER,
            "job.json": json.dumps({
                "timeout_seconds": job.timeout_seconds,
                "max_output_bytes": settings.scripts_max_output_bytes,
            }),
        },
    }  # fmt: skip


def now_utc() -> datetime:
    return datetime.now(UTC)
