"""Run a rockbot process the way its pod runs it, on this machine: the container's constraints, no container.

What a pod gives the process, and what this reproduces with bubblewrap and setpriv:
- a numeric uid/gid with no passwd entry (the chart's `runAsUser`, 65532), no capabilities, no new privileges;
- a read-only root filesystem, with a private writable `/tmp` that is also `HOME` (the image sets it);
- its own PID namespace (under bubblewrap's init, so that the whole namespace dies with the test: a pod's
  process is PID 1 and ignores SIGTERM unless it handles it, so tests expect exit code 0 after SIGTERM,
  which a process without a handler never gives);
- exactly the environment and arguments of its manifest (no `USER`, no `LOGNAME`), and the files of its
  volumes, mounted read-only under `/tmp/volumes/<mountPath>` (bubblewrap cannot create new mount points
  in the read-only root) with arguments naming the mount path rewritten to match.
The host's network is shared, so the process reaches the emulated API server and broker on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from tests.fixtures.rabbitmq import RabbitBroker

ROCKBOT = Path(sys.executable).with_name("rockbot")
#: What the process runs from: this checkout (with the venv's editable install) and the venv's Python.
CODE = (Path(__file__).resolve().parents[1], Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve())
VOLUMES = "/tmp/volumes"
#: Where a test puts the kubeconfig that stands in for the pod's service account.
KUBECONFIG = f"{VOLUMES}/kubeconfig"


class PodProcess:
    """One process in its sandbox; `terminate()` sends SIGTERM to it (not to bubblewrap), as the kubelet does."""

    def __init__(self, *, command: list[str], env: Mapping[str, str], uid: int, files: Mapping[str, str]) -> None:
        if shutil.which("bwrap") is None or shutil.which("setpriv") is None:
            pytest.fail("bubblewrap and setpriv are needed: apt-get install -y bubblewrap util-linux")
        self._folder = Path(tempfile.mkdtemp(prefix="rockbot-pod-"))
        self._folder.chmod(0o755)
        self.log_path = self._folder / "output.log"
        volumes = self._folder / "volumes"
        volumes.mkdir(mode=0o755)
        for target, text in files.items():
            assert target.startswith(VOLUMES + "/"), f"{target}: files go under {VOLUMES}"
            source = volumes / target.removeprefix(VOLUMES + "/")
            source.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
            source.write_text(text)
            source.chmod(0o644)
            for folder in source.relative_to(volumes).parents:  # mkdir's mode is masked by the umask
                (volumes / folder).chmod(0o755)
        info_read, info_write = os.pipe()
        sandbox = [
            "bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--perms", "1777", "--tmpfs", "/tmp",
            *_code_in_reach(CODE), "--ro-bind", str(volumes), VOLUMES,
            "--unshare-pid", "--die-with-parent", "--chdir", "/tmp",
            "--clearenv", *[arg for name, value in env.items() for arg in ("--setenv", name, value)],
            "--info-fd", str(info_write), "--",
            "setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--no-new-privs",
            "--inh-caps=-all", "--bounding-set=-all", "--",
        ]  # fmt: skip
        with self.log_path.open("wb") as log:
            self._bwrap = subprocess.Popen(
                [*sandbox, *command], stdout=log, stderr=subprocess.STDOUT, pass_fds=[info_write],
                start_new_session=True,
            )  # fmt: skip
        os.close(info_write)
        with os.fdopen(info_read) as info:
            text = info.read()
        if not text:
            raise RuntimeError(f"bubblewrap did not start the process: {self.output()}")
        self.pid = _only_child(int(json.loads(text)["child-pid"]))

    def terminate(self) -> None:
        """SIGTERM to the process itself (not to bubblewrap), as the kubelet sends it."""
        os.kill(self.pid, signal.SIGTERM)

    async def exited(self, *, within: float) -> int | None:
        """The exit code, or None if it is still running after `within` seconds."""
        try:
            return await asyncio.to_thread(self._bwrap.wait, within)
        except subprocess.TimeoutExpired:
            return None

    @property
    def running(self) -> bool:
        return self._bwrap.poll() is None

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def lines(self) -> list[str]:
        return [line for line in self.output().splitlines() if line.strip()]

    def records(self) -> list[dict[str, Any]]:
        """Every output line as the JSON object it must be; fails naming the first line that is not one."""
        records = []
        for line in self.lines():
            try:
                record = json.loads(line)
            except ValueError:
                pytest.fail(f"a log line is not JSON: {line!r}\n--- whole output:\n{self.output()[-5000:]}")
            assert isinstance(record, dict), f"a log line is not a JSON object: {line!r}"
            records.append(record)
        return records

    def cpu_seconds(self) -> float:
        """CPU time the process has used so far, user and system, all threads (its rusage, from /proc)."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def memory(self) -> tuple[int, int]:
        """(resident set size, its peak so far) in bytes: what a pod's memory limit counts."""
        status = dict(line.split(":", 1) for line in Path(f"/proc/{self.pid}/status").read_text().splitlines())
        return int(status["VmRSS"].split()[0]) * 1024, int(status["VmHWM"].split()[0]) * 1024

    def kill(self) -> None:
        if self.running:
            os.killpg(self._bwrap.pid, signal.SIGKILL)
            self._bwrap.wait()

    def cleanup(self) -> None:
        self.kill()
        shutil.rmtree(self._folder, ignore_errors=True)


def _code_in_reach(paths: tuple[Path, ...]) -> list[str]:
    """bubblewrap arguments that let any uid run the code at `paths`, wherever the checkout lives.

    The pod's own `/tmp` hides a checkout or venv under /tmp (a CI clone, say), and a folder others
    may not enter (a 0700 `/root` holding the checkout or a pyenv Python) shuts a uid without a
    passwd entry out: the topmost such folder becomes an empty tmpfs, and the paths are bound back
    into it read-only, below folders anyone may enter (bubblewrap would make them 0700).
    """
    hidden: set[Path] = {Path("/tmp")}  # already the pod's tmpfs
    for path in paths:
        for folder in [*reversed(path.parents)][1:]:
            if folder in hidden:
                break
            if not folder.stat().st_mode & 0o001:
                hidden.add(folder)
                break
    args = [arg for folder in sorted(hidden - {Path("/tmp")}) for arg in ("--tmpfs", str(folder))]
    for path in sorted(set(paths)):
        top = next((folder for folder in hidden if path.is_relative_to(folder)), None)
        if top is not None:
            between = [folder for folder in reversed(path.parents) if folder.is_relative_to(top) and folder != top]
            args += [arg for folder in between for arg in ("--perms", "0755", "--dir", str(folder))]
            args += ["--ro-bind", str(path), str(path)]
    return args


def _only_child(init: int) -> int:
    """The process bubblewrap's init started (it shows up a moment after the init)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            children = Path(f"/proc/{init}/task/{init}/children").read_text().split()
            if children:
                return int(children[0])
        time.sleep(0.01)
    raise RuntimeError("bubblewrap's init started no process")


def kubeconfig_for(emulator: Any, *, token: str) -> str:
    """A kubeconfig for the emulated API server, logging in with `token` (so requests can be told apart)."""
    return yaml.safe_dump({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "emulator", "cluster": {"server": str(emulator.url).rstrip("/")}}],
        "users": [{"name": "pod", "user": {"token": token}}],
        "contexts": [{"name": "emulator", "context": {"cluster": "emulator", "user": "pod"}}],
        "current-context": "emulator",
    })


def chart_pod_spec(manifests: list[dict[str, Any]], component: str) -> dict[str, Any]:
    """The pod spec of the chart's Deployment of `component` (operator, scripts-manager)."""
    (deployment,) = [m for m in manifests if m["kind"] == "Deployment"
                     and m["metadata"]["labels"].get("app.kubernetes.io/component") == component]
    return deployment["spec"]["template"]["spec"]


def container_command(
    pod_spec: Mapping[str, Any], *, values_from: Mapping[str, str], extra_args: list[str] | None = None
) -> tuple[list[str], dict[str, str], int]:
    """The command, environment and uid of a pod spec's only container, as the kubelet would start it.

    The image's entrypoint is `rockbot` with `HOME=/tmp`; `values_from` gives the value of each
    variable the manifest takes from a Secret or a field (the test decides what those hold).
    """
    (container,) = pod_spec["containers"]
    env = {"HOME": "/tmp", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1", "PATH": "/usr/bin:/bin"}
    for entry in container.get("env") or []:
        name = entry["name"]
        if "value" in entry:
            env[name] = str(entry["value"])
        elif name in values_from:
            env[name] = values_from[name]
        elif "valueFrom" in entry:
            raise AssertionError(f"the manifest takes {name} from {entry['valueFrom']}: give its value in values_from")
    relocated = [mount["mountPath"] for mount in _file_mounts(pod_spec)]
    args = [_relocate(str(arg), relocated) for arg in container.get("args") or []]
    uid = int((container.get("securityContext") or {}).get("runAsUser") or pod_spec["securityContext"]["runAsUser"])
    return [str(ROCKBOT), *args, *(extra_args or [])], env, uid


def _file_mounts(pod_spec: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The container's mounts of volumes with files (ConfigMaps, Secrets); an emptyDir at /tmp is the tmpfs."""
    with_files = {v["name"] for v in pod_spec.get("volumes") or [] if "emptyDir" not in v}
    return [m for m in pod_spec["containers"][0].get("volumeMounts") or [] if m["name"] in with_files]


def _relocate(arg: str, mount_paths: list[str]) -> str:
    for path in mount_paths:
        if arg == path or arg.startswith(path + "/"):
            return VOLUMES + arg
    return arg


def start(
    pod_spec: Mapping[str, Any],
    *,
    values_from: Mapping[str, str] | None = None,
    volumes: Mapping[str, Mapping[str, str]] | None = None,
    extra_args: list[str] | None = None,
    extra_env: Mapping[str, str] | None = None,
    files: Mapping[str, str] | None = None,
) -> PodProcess:
    """Start the pod spec's container; `volumes` maps a volume name to its files ({key: text}).

    `extra_args`, `extra_env` and `files` (paths under /tmp/volumes) are what the test adds to the
    manifest, such as a kubeconfig standing in for the pod's service account.
    """
    command, env, uid = container_command(pod_spec, values_from=values_from or {}, extra_args=extra_args)
    files = dict(files or {})
    for mount in _file_mounts(pod_spec):
        for key, text in (volumes or {}).get(mount["name"], {}).items():
            files[f"{VOLUMES}{mount['mountPath']}/{key}"] = text
    return PodProcess(command=command, env={**env, **(extra_env or {})}, uid=uid, files=files)


async def wait_until(probe: Any, *, within: float, what: str, process: PodProcess | None = None) -> Any:
    """Poll `probe` (sync or async) until it returns something truthy; fail naming `what` (and the output).

    Async, so the event loop serving the emulated API server keeps serving the process meanwhile.
    """
    deadline = time.monotonic() + within
    while True:
        result = probe()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return result
        if process is not None and not process.running:
            pytest.fail(f"the process exited while waiting for {what}:\n{process.output()[-5000:]}")
        if time.monotonic() > deadline:
            tail = f":\n{process.output()[-5000:]}" if process is not None else ""
            pytest.fail(f"not {what} within {within} s{tail}")
        await asyncio.sleep(0.05)


async def http_get(url: str) -> tuple[int, str] | None:
    """(status, body) of a GET, or None when nothing answers (connection refused, timeout)."""
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as session,
            session.get(url) as response,
        ):
            return response.status, await response.text()
    except (aiohttp.ClientError, TimeoutError):
        return None


class Probes:
    """A process's `/healthz` and `/readyz` on 127.0.0.1:`port`, as the kubelet probes them."""

    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}"

    async def live(self) -> bool:
        answer = await http_get(f"{self.base}/healthz")
        return answer is not None and answer[0] == 200

    async def readiness(self) -> tuple[int, str] | None:
        return await http_get(f"{self.base}/readyz")

    async def ready(self) -> bool:
        answer = await self.readiness()
        return answer is not None and answer[0] == 200


def waiting_for_the_broker(probes: Probes, saying: str = "cannot reach the broker") -> Any:
    """A probe for `wait_until`: the (503, reason) answer once readiness says `saying` (it cannot reach the broker)."""

    async def probe() -> tuple[int, str] | None:
        answer = await probes.readiness()
        return answer if answer is not None and answer[0] == 503 and saying in answer[1] else None

    return probe


@pytest.fixture
def pods() -> Iterator[list[PodProcess]]:
    """A list to put started processes in; each is killed and cleaned up at the end of the test."""
    started: list[PodProcess] = []
    try:
        yield started
    finally:
        for process in started:
            process.cleanup()


@pytest.fixture
def late_rabbitmq(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RabbitBroker]:
    """A private broker with its ports chosen but not started: the test starts it (and may stop it) later."""
    broker = RabbitBroker(root=tmp_path_factory.mktemp("late-rabbit"))
    try:
        yield broker
    finally:
        broker.stop()
