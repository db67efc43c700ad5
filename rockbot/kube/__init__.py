"""A thin async Kubernetes REST client: plain JSON dicts in and out, errors as typed exceptions.

Generated models hide what the API server really answers; rockbot speaks the wire format
(camelCase dicts) so that tests against the HTTP emulator and runs on a real cluster exercise
the same requests.
"""

from rockbot.kube.attach import AttachSession, Output
from rockbot.kube.client import K8sObject, KubeClient, ObjectList, WatchEvent
from rockbot.kube.errors import (
    ApiError,
    Conflict,
    Gone,
    Invalid,
    KubeConfigError,
    NotFound,
    Unauthorized,
    Unavailable,
)
from rockbot.kube.resources import (
    AGENTS,
    CONFIGMAPS,
    CRDS,
    DEPLOYMENTS,
    EVALUATIONS,
    EVENTS,
    LEASES,
    NAMESPACES,
    NETWORKPOLICIES,
    PODS,
    SCHEDULED_TASKS,
    SECRETS,
    SERVICEACCOUNTS,
    SERVICES,
    SUBJECT_ACCESS_REVIEWS,
    TOKEN_REVIEWS,
    TOOLS,
    TRIGGERS,
    Resource,
)

__all__ = [
    "AGENTS",
    "CONFIGMAPS",
    "CRDS",
    "DEPLOYMENTS",
    "EVALUATIONS",
    "EVENTS",
    "LEASES",
    "NAMESPACES",
    "NETWORKPOLICIES",
    "PODS",
    "SCHEDULED_TASKS",
    "SECRETS",
    "SERVICEACCOUNTS",
    "SERVICES",
    "SUBJECT_ACCESS_REVIEWS",
    "TOKEN_REVIEWS",
    "TOOLS",
    "TRIGGERS",
    "ApiError",
    "AttachSession",
    "Conflict",
    "Gone",
    "Invalid",
    "K8sObject",
    "KubeClient",
    "KubeConfigError",
    "NotFound",
    "ObjectList",
    "Output",
    "Resource",
    "Unauthorized",
    "Unavailable",
    "WatchEvent",
]
