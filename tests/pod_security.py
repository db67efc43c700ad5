"""The Pod Security Standards' `restricted` level (which includes `baseline`), checked on a pod.

Mirrors the checks of Kubernetes' pod-security-admission (policy/check_*.go, level "latest"), so a pod
that passes here is admitted by a namespace labelled `pod-security.kubernetes.io/enforce: restricted`.
The one checker for every pod rockbot makes: the chart's workloads, the operator's agent Deployments
and the scripts-manager's script pods. Each finding starts with the name of the check it breaks.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

PodSpec = dict[str, Any]

# baseline: capabilities that may be added (check_capabilities_baseline.go)
BASELINE_CAPABILITIES = {
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
    "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
}
# baseline: sysctls considered safe (check_sysctls.go)
SAFE_SYSCTLS = {
    "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
}
# baseline: SELinux types allowed (check_seLinuxOptions.go)
SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
# restricted: volume sources allowed (check_restrictedVolumes.go)
RESTRICTED_VOLUMES = {
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret",
}


def _containers(spec: PodSpec) -> Iterator[tuple[str, dict[str, Any]]]:
    for field in ("initContainers", "containers", "ephemeralContainers"):
        for container in spec.get(field) or []:
            yield f"{field}[{container.get('name')}]", container


def _baseline(spec: PodSpec) -> Iterator[str]:
    pod_sc = spec.get("securityContext") or {}
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(field):
            yield f"hostNamespaces: {field} must be unset or false"
    if (pod_sc.get("windowsOptions") or {}).get("hostProcess"):
        yield "hostProcess: securityContext.windowsOptions.hostProcess must be unset or false"
    for volume in spec.get("volumes") or []:
        if "hostPath" in volume:
            yield f"hostPathVolumes: volume {volume.get('name')} uses hostPath"
    if pod_sc.get("seccompProfile", {}).get("type") == "Unconfined":
        yield "seccompProfile_baseline: pod seccompProfile must not be Unconfined"
    yield from _selinux("pod", pod_sc.get("seLinuxOptions"))
    yield from _apparmor("pod", pod_sc.get("appArmorProfile"))
    for sysctl in pod_sc.get("sysctls") or []:
        if sysctl.get("name") not in SAFE_SYSCTLS:
            yield f"sysctls: {sysctl.get('name')} is not a safe sysctl"
    for where, container in _containers(spec):
        sc = container.get("securityContext") or {}
        if sc.get("privileged"):
            yield f"privileged: {where} must not be privileged"
        if (sc.get("windowsOptions") or {}).get("hostProcess"):
            yield f"hostProcess: {where} must not be a host process"
        added = set((sc.get("capabilities") or {}).get("add") or [])
        if added - BASELINE_CAPABILITIES:
            yield f"capabilities_baseline: {where} adds {sorted(added - BASELINE_CAPABILITIES)}"
        for port in container.get("ports") or []:
            if port.get("hostPort"):
                yield f"hostPorts: {where} uses hostPort {port['hostPort']}"
        if sc.get("procMount", "Default") != "Default":
            yield f"procMount: {where} must use the Default procMount"
        if (sc.get("seccompProfile") or {}).get("type") == "Unconfined":
            yield f"seccompProfile_baseline: {where} seccompProfile must not be Unconfined"
        yield from _selinux(where, sc.get("seLinuxOptions"))
        yield from _apparmor(where, sc.get("appArmorProfile"))


def _selinux(where: str, options: dict[str, Any] | None) -> Iterator[str]:
    if not options:
        return
    if options.get("type", "") not in SELINUX_TYPES:
        yield f"seLinuxOptions: {where} uses SELinux type {options['type']}"
    if options.get("user") or options.get("role"):
        yield f"seLinuxOptions: {where} must not set SELinux user or role"


def _apparmor(where: str, profile: dict[str, Any] | None) -> Iterator[str]:
    if profile and profile.get("type") not in ("RuntimeDefault", "Localhost"):
        yield f"appArmorProfile: {where} uses AppArmor profile {profile.get('type')}"


def _restricted(spec: PodSpec) -> Iterator[str]:
    pod_sc = spec.get("securityContext") or {}
    for volume in spec.get("volumes") or []:
        kinds = set(volume) - {"name"}
        if kinds - RESTRICTED_VOLUMES:
            yield f"restrictedVolumes: volume {volume.get('name')} uses {sorted(kinds - RESTRICTED_VOLUMES)}"
    if pod_sc.get("runAsUser") == 0:
        yield "runAsUser: pod runAsUser must not be 0"
    pod_non_root = pod_sc.get("runAsNonRoot")
    pod_seccomp = (pod_sc.get("seccompProfile") or {}).get("type")
    for where, container in _containers(spec):
        sc = container.get("securityContext") or {}
        if sc.get("allowPrivilegeEscalation") is not False:
            yield f"allowPrivilegeEscalation: {where} must set allowPrivilegeEscalation: false"
        non_root = sc.get("runAsNonRoot", pod_non_root)
        if non_root is not True:
            yield f"runAsNonRoot: {where} must run with runAsNonRoot: true (pod or container)"
        if sc.get("runAsUser") == 0:
            yield f"runAsUser: {where} runAsUser must not be 0"
        seccomp = (sc.get("seccompProfile") or {}).get("type", pod_seccomp)
        if seccomp not in ("RuntimeDefault", "Localhost"):
            yield f"seccompProfile_restricted: {where} needs seccompProfile RuntimeDefault or Localhost"
        capabilities = sc.get("capabilities") or {}
        if "ALL" not in (capabilities.get("drop") or []):
            yield f"capabilities_restricted: {where} securityContext.capabilities.drop must include ALL"
        if set(capabilities.get("add") or []) - {"NET_BIND_SERVICE"}:
            yield f"capabilities_restricted: {where} may add only NET_BIND_SERVICE"


def restricted_violations(pod: dict[str, Any]) -> list[str]:
    """Every way a Pod manifest, or a bare pod spec, breaks the `restricted` level; empty when it complies."""
    spec = pod.get("spec", pod)  # a pod spec has no `spec` field of its own
    return [*_baseline(spec), *_restricted(spec)]


def pod_specs(manifest: dict[str, Any]) -> Iterator[PodSpec]:
    """The pod specs inside a workload manifest (none for other kinds)."""
    kind, spec = manifest.get("kind"), manifest.get("spec") or {}
    if kind == "Pod":
        yield spec
    elif kind in ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"):
        yield spec["template"]["spec"]
    elif kind == "CronJob":
        yield spec["jobTemplate"]["spec"]["template"]["spec"]
