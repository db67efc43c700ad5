"""Built-in kinds: the defaults the API server fills in and a subset of its validation.

Defaults matter for honesty: code that compares what it wants with what the server holds must
cope with the fields the server adds (a Deployment's `strategy`, a container's
`imagePullPolicy`, a Service's `clusterIP`...). Only the validation rules listed here are
checked; everything else a real server would refuse is accepted, so do not rely on the emulator
to catch a malformed Pod beyond these.
"""

import base64
import binascii
import copy
import ipaddress
import itertools
import re
from typing import Any

from tests.kubeapi.errors import invalid
from tests.kubeapi.registry import ResourceType

Obj = dict[str, Any]
Cause = tuple[str, str, str]

_CONFIG_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")
_service_ips = itertools.count(10)


def on_create(rtype: ResourceType, obj: Obj) -> None:
    """What the server sets on creation only (initial status, allocated addresses)."""
    match rtype.key:
        case ("", "namespaces"):
            obj["status"] = {"phase": "Active"}
            obj.setdefault("spec", {}).setdefault("finalizers", ["kubernetes"])
        case ("", "pods"):
            obj["status"] = {"phase": "Pending", "qosClass": _qos_class(obj.get("spec") or {})}
        case ("apps", "deployments"):
            obj["status"] = {}
        case ("", "services"):
            spec = obj.setdefault("spec", {})
            if spec.get("type", "ClusterIP") != "ExternalName" and not spec.get("clusterIP"):
                address = str(ipaddress.IPv4Address("10.96.0.0") + next(_service_ips))
                spec["clusterIP"] = address
                spec["clusterIPs"] = [address]


def admit(rtype: ResourceType, *, obj: Obj, old: Obj | None) -> None:
    """Fill in defaults and check the validated subset; raises 422 naming the fields."""
    causes: list[Cause] = []
    spec = obj.get("spec")
    match rtype.key:
        case ("", "namespaces"):
            obj["metadata"].setdefault("labels", {})["kubernetes.io/metadata.name"] = obj["metadata"]["name"]
        case ("apps", "deployments"):
            causes += _deployment(obj, old)
        case ("", "pods"):
            if isinstance(spec, dict):
                _pod_spec_defaults(spec)
            causes += _pod_spec_causes(spec, "spec")
            if old is not None:
                causes += _pod_update_causes(old.get("spec"), spec)
        case ("", "services"):
            causes += _service(obj)
        case ("", "configmaps"):
            for field in ("data", "binaryData"):
                for key, value in (obj.get(field) or {}).items():
                    if not _CONFIG_KEY.match(key):
                        causes.append((f"{field}[{key}]", "FieldValueInvalid", f'Invalid value: "{key}": a valid '
                                       "config key must consist of alphanumeric characters, '-', '_' or '.'"))
                    if field == "data" and not isinstance(value, str):
                        causes.append((f"data[{key}]", "FieldValueTypeInvalid", "Invalid value: must be a string"))
        case ("", "secrets"):
            causes += _secret(obj)
        case ("networking.k8s.io", "networkpolicies"):
            if isinstance(spec, dict) and "policyTypes" not in spec:
                spec["policyTypes"] = ["Ingress", "Egress"] if spec.get("egress") else ["Ingress"]
            if not isinstance(spec, dict) or "podSelector" not in spec:
                causes.append(("spec.podSelector", "FieldValueRequired", "Required value"))
    if causes:
        raise invalid(kind=rtype.kind, group=rtype.group, name=obj["metadata"].get("name", ""), causes=causes)


def _deployment(obj: Obj, old: Obj | None) -> list[Cause]:
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return [("spec", "FieldValueRequired", "Required value")]
    spec.setdefault("replicas", 1)
    spec.setdefault("revisionHistoryLimit", 10)
    spec.setdefault("progressDeadlineSeconds", 600)
    strategy = spec.setdefault("strategy", {"type": "RollingUpdate"})
    if strategy.get("type", "RollingUpdate") == "RollingUpdate":
        strategy.setdefault("type", "RollingUpdate")
        strategy.setdefault("rollingUpdate", {}).setdefault("maxUnavailable", "25%")
        strategy["rollingUpdate"].setdefault("maxSurge", "25%")
    causes: list[Cause] = []
    selector = spec.get("selector")
    template = spec.get("template") or {}
    labels = (template.get("metadata") or {}).get("labels") or {}
    if not isinstance(selector, dict) or not (selector.get("matchLabels") or selector.get("matchExpressions")):
        causes.append(("spec.selector", "FieldValueRequired", "Required value"))
    elif any(labels.get(key) != value for key, value in (selector.get("matchLabels") or {}).items()):
        causes.append(("spec.template.metadata.labels", "FieldValueInvalid",
                       f"Invalid value: {labels}: `selector` does not match template `labels`"))
    if old is not None and (old.get("spec") or {}).get("selector") != selector:
        causes.append(("spec.selector", "FieldValueInvalid", f"Invalid value: {selector}: field is immutable"))
    pod_spec = template.get("spec")
    if isinstance(pod_spec, dict):
        _pod_spec_defaults(pod_spec)
        if pod_spec.get("restartPolicy") != "Always":
            causes.append(("spec.template.spec.restartPolicy", "FieldValueNotSupported",
                           f'Unsupported value: "{pod_spec.get("restartPolicy")}": supported values: "Always"'))
    causes += _pod_spec_causes(pod_spec, "spec.template.spec")
    return causes


def _pod_spec_defaults(spec: Obj) -> None:
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("securityContext", {})
    if "serviceAccountName" in spec or "serviceAccount" in spec:
        spec.setdefault("serviceAccountName", spec.get("serviceAccount"))
        spec["serviceAccount"] = spec["serviceAccountName"]
    for field in ("initContainers", "containers"):
        for container in spec.get(field) or []:
            if not isinstance(container, dict):
                continue
            container.setdefault("terminationMessagePath", "/dev/termination-log")
            container.setdefault("terminationMessagePolicy", "File")
            image = str(container.get("image", ""))
            tag = image.rsplit("/", 1)[-1].partition(":")[2] if "@" not in image else "digest"
            container.setdefault("imagePullPolicy", "Always" if tag in ("", "latest") else "IfNotPresent")
            container.setdefault("resources", {})
            for port in container.get("ports") or []:
                port.setdefault("protocol", "TCP")
            for env in container.get("env") or []:
                field_ref = (env.get("valueFrom") or {}).get("fieldRef")
                if isinstance(field_ref, dict):
                    field_ref.setdefault("apiVersion", "v1")


def _pod_spec_causes(spec: Any, path: str) -> list[Cause]:
    if not isinstance(spec, dict):
        return [(path, "FieldValueRequired", "Required value")]
    containers = spec.get("containers")
    if not containers:
        return [(f"{path}.containers", "FieldValueRequired", "Required value")]
    causes: list[Cause] = []
    names = set()
    for index, container in enumerate(containers):
        for field in ("name", "image"):
            if not container.get(field):
                causes.append((f"{path}.containers[{index}].{field}", "FieldValueRequired", "Required value"))
        if container.get("name") in names:
            causes.append((f"{path}.containers[{index}].name", "FieldValueDuplicate",
                           f'Duplicate value: "{container["name"]}"'))
        names.add(container.get("name"))
        for env_index, env in enumerate(container.get("env") or []):
            if "value" in env and "valueFrom" in env:
                causes.append((f"{path}.containers[{index}].env[{env_index}].valueFrom", "FieldValueInvalid",
                               "Invalid value: \"\": may not be specified when `value` is not empty"))
    return causes


def _pod_update_causes(old: Any, new: Any) -> list[Cause]:
    """A pod's spec is immutable but for images, added tolerations and a deadline that may only come closer."""
    if _mutable_pod_view(old) != _mutable_pod_view(new):
        return [("spec", "FieldValueForbidden", "Forbidden: pod updates may not change fields other than "
                 "`spec.containers[*].image`, `spec.activeDeadlineSeconds`, `spec.tolerations` (only additions)")]
    before = (old or {}).get("activeDeadlineSeconds")
    after = (new or {}).get("activeDeadlineSeconds")
    if after is None and before is not None:
        return [("spec.activeDeadlineSeconds", "FieldValueInvalid",
                 "Invalid value: \"null\": must not update from a positive integer to nil value")]
    if after is not None and before is not None and after > before:
        return [("spec.activeDeadlineSeconds", "FieldValueInvalid",
                 f"Invalid value: {after}: must be less than or equal to previous value")]
    return []


def _mutable_pod_view(spec: Any) -> Any:
    view = copy.deepcopy(spec) if isinstance(spec, dict) else spec
    if isinstance(view, dict):
        view.pop("activeDeadlineSeconds", None)
        view.pop("tolerations", None)
        for container in view.get("containers") or []:
            container.pop("image", None)
    return view


def _service(obj: Obj) -> list[Cause]:
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return [("spec", "FieldValueRequired", "Required value")]
    spec.setdefault("type", "ClusterIP")
    spec.setdefault("sessionAffinity", "None")
    if spec["type"] != "ExternalName":
        spec.setdefault("ipFamilies", ["IPv4"])
        spec.setdefault("ipFamilyPolicy", "SingleStack")
        spec.setdefault("internalTrafficPolicy", "Cluster")
    causes: list[Cause] = []
    ports = spec.get("ports") or []
    if not ports and spec.get("clusterIP") != "None" and spec["type"] != "ExternalName":
        causes.append(("spec.ports", "FieldValueRequired", "Required value"))
    for index, port in enumerate(ports):
        port.setdefault("protocol", "TCP")
        if "port" not in port:
            causes.append((f"spec.ports[{index}].port", "FieldValueRequired", "Required value"))
        else:
            port.setdefault("targetPort", port["port"])
        if len(ports) > 1 and not port.get("name"):
            causes.append((f"spec.ports[{index}].name", "FieldValueRequired", "Required value"))
    return causes


def _secret(obj: Obj) -> list[Cause]:
    obj.setdefault("type", "Opaque")
    # stringData is write-only: the server folds it into data and never stores it.
    string_data = obj.pop("stringData", None) or {}
    data = obj.setdefault("data", {}) if string_data or "data" in obj else {}
    for key, value in string_data.items():
        data[key] = base64.b64encode(str(value).encode()).decode()
    causes: list[Cause] = []
    for key, value in data.items():
        try:
            base64.b64decode(value, validate=True)
        except (binascii.Error, TypeError, ValueError):
            causes.append((f"data[{key}]", "FieldValueInvalid", "Invalid value: must be base64 encoded"))
        if not _CONFIG_KEY.match(key):
            causes.append((f"data[{key}]", "FieldValueInvalid", f'Invalid value: "{key}": a valid config key '
                           "must consist of alphanumeric characters, '-', '_' or '.'"))
    return causes


def _qos_class(spec: Obj) -> str:
    containers = spec.get("containers") or []
    resources = [c.get("resources") or {} for c in containers if isinstance(c, dict)]
    if not any(r.get("requests") or r.get("limits") for r in resources):
        return "BestEffort"
    guaranteed = all(
        r.get("limits") and all(r.get("limits", {}).get(k) == r.get("requests", r.get("limits")).get(k)
                                for k in ("cpu", "memory"))
        and {"cpu", "memory"} <= set(r.get("limits", {}))
        for r in resources
    )
    return "Guaranteed" if guaranteed else "Burstable"
