"""The trusted service that runs `execute_python_script` requests in throw-away sandboxes.

Agents publish a `ScriptInvokeRequest` on `script.invoke`; the manager (`service.py`) checks it
against the deployment's limits (`policy.py`), runs it on a backend and replies on the agent's
per-process reply queue before acking. Backends (`backends/`): `pods` runs each script in a
network-less pod of its own in ROCKBOT_SCRIPTS_NAMESPACE, made for it or claimed from a warm pool
(the production path; the agent itself has no Kubernetes rights at all); `local` runs a
bubblewrap/unshare sandbox for development and `rockbot local`.

`pip_packages` never gives a sandbox network access. Only packages listed in
ROCKBOT_SCRIPTS_ALLOWED_PACKAGES may be named (bare PEP 508 names); with none listed, a request
with packages is answered `Rejected` with these instructions.
- pods: the listed packages must already be installed in ROCKBOT_SCRIPTS_IMAGE (build a runtime
  image `FROM python:3.12-slim` with them); the pod stays without any egress.
- local: each distinct set is installed once by pip on the host (wheels only, from
  ROCKBOT_SCRIPTS_PIP_INDEX_URL or the offline ROCKBOT_SCRIPTS_PIP_FIND_LINKS) into a
  content-addressed cache under ROCKBOT_SCRIPTS_PACKAGE_CACHE (only the manager may write it),
  bind-mounted read-only.
"""
