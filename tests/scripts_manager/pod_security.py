"""A check equal to Pod Security `restricted` (baseline + restricted rules, policy version latest).

Mirrors the official Pod Security Standards so a pod spec can be tested without an admission
controller: each violation is returned as a sentence naming the field.
"""

from __future__ import annotations

from typing import Any

_BASELINE_CAPABILITIES = {
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
    "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
}  # fmt: skip
_SAFE_SYSCTLS = {
    "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
}  # fmt: skip
_RESTRICTED_VOLUMES = {
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret",
}
_SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}


def restricted_violations(pod: dict[str, Any]) -> list[str]:
    spec = pod.get("spec") or {}
    psc = spec.get("securityContext") or {}
    containers = [
        (f"{kind}[{c.get('name')}]", c)
        for kind in ("containers", "initContainers", "ephemeralContainers")
        for c in spec.get(kind) or []
    ]
    problems: list[str] = []
    # --- baseline
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(field):
            problems.append(f"spec.{field} must not be true")
    if (psc.get("windowsOptions") or {}).get("hostProcess"):
        problems.append("spec.securityContext.windowsOptions.hostProcess must not be true")
    for volume in spec.get("volumes") or []:
        if "hostPath" in volume:
            problems.append(f"volume {volume.get('name')} must not be a hostPath")
        kinds = set(volume) - {"name"}
        if not kinds <= _RESTRICTED_VOLUMES:
            problems.append(f"volume {volume.get('name')} uses {sorted(kinds - _RESTRICTED_VOLUMES)}, not allowed")
    for sysctl in psc.get("sysctls") or []:
        if sysctl.get("name") not in _SAFE_SYSCTLS:
            problems.append(f"sysctl {sysctl.get('name')} is not in the safe set")
    if (psc.get("seLinuxOptions") or {}).get("type", "") not in _SELINUX_TYPES:
        problems.append("spec.securityContext.seLinuxOptions.type is not allowed")
    if (psc.get("seccompProfile") or {}).get("type") == "Unconfined":
        problems.append("spec.securityContext.seccompProfile.type must not be Unconfined")
    if (psc.get("appArmorProfile") or {}).get("type") == "Unconfined":
        problems.append("spec.securityContext.appArmorProfile.type must not be Unconfined")
    if psc.get("runAsUser") == 0:
        problems.append("spec.securityContext.runAsUser must not be 0")
    pod_seccomp_ok = (psc.get("seccompProfile") or {}).get("type") in ("RuntimeDefault", "Localhost")
    for where, container in containers:
        sc = container.get("securityContext") or {}
        if sc.get("privileged"):
            problems.append(f"{where}.securityContext.privileged must not be true")
        if (sc.get("windowsOptions") or {}).get("hostProcess"):
            problems.append(f"{where}.securityContext.windowsOptions.hostProcess must not be true")
        for port in container.get("ports") or []:
            if port.get("hostPort"):
                problems.append(f"{where} must not use hostPort")
        if sc.get("procMount", "Default") != "Default":
            problems.append(f"{where}.securityContext.procMount must be Default")
        if (sc.get("seLinuxOptions") or {}).get("type", "") not in _SELINUX_TYPES:
            problems.append(f"{where}.securityContext.seLinuxOptions.type is not allowed")
        if (sc.get("appArmorProfile") or {}).get("type") == "Unconfined":
            problems.append(f"{where}.securityContext.appArmorProfile.type must not be Unconfined")
        added = set((sc.get("capabilities") or {}).get("add") or [])
        if not added <= _BASELINE_CAPABILITIES:
            problems.append(f"{where} adds capabilities beyond baseline: {sorted(added - _BASELINE_CAPABILITIES)}")
        # --- restricted
        if sc.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{where}.securityContext.allowPrivilegeEscalation must be false")
        run_as_non_root = sc.get("runAsNonRoot", psc.get("runAsNonRoot"))
        if run_as_non_root is not True:
            problems.append(f"{where} must set runAsNonRoot=true (pod or container)")
        if sc.get("runAsUser") == 0:
            problems.append(f"{where}.securityContext.runAsUser must not be 0")
        seccomp = (sc.get("seccompProfile") or {}).get("type")
        if seccomp == "Unconfined" or (seccomp is None and not pod_seccomp_ok) or (
            seccomp is not None and seccomp not in ("RuntimeDefault", "Localhost")
        ):
            problems.append(f"{where} must use seccompProfile RuntimeDefault or Localhost")
        capabilities = sc.get("capabilities") or {}
        if "ALL" not in (capabilities.get("drop") or []):
            problems.append(f"{where}.securityContext.capabilities.drop must include ALL")
        if not added <= {"NET_BIND_SERVICE"}:
            problems.append(f"{where} may only add NET_BIND_SERVICE")
    return problems
