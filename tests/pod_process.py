"""Run a rockbot process the way its pod runs it, on this machine: the container's constraints, no container.

What a pod gives the process, and what this reproduces with bubblewrap and setpriv:
- a numeric uid/gid with no passwd entry (the chart's `runAsUser`, 65532), no capabilities, no new privileges;
- a read-only root filesystem, with a private writable `/tmp` that is also `HOME` (the image sets it);
- PID 1 of its own PID namespace (so SIGTERM does nothing unless the process handles it);
- exactly the environment and arguments of its manifest (no `USER`, no `LOGNAME`), and the files of its
  volumes, mounted read-only under `/tmp/volumes/<mountPath>` (bubblewrap cannot create new mount points
  in the read-only root) with arguments naming the mount path rewritten to match.
The host's network is shared, so the process reaches the emulated API server and broker on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
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

from tests.fixtures.rabbitmq import RabbitBroker

ROCKBOT = Path(sys.executable).with_name("rockbot")
VOLUMES = "/tmp/volumes"


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
            "--ro-bind", str(volumes), VOLUMES, "--unshare-pid", "--as-pid-1", "--die-with-parent", "--chdir", "/tmp",
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
        self.pid = int(json.loads(text)["child-pid"])

    def terminate(self) -> None:
        """SIGTERM to the process itself, PID 1 of its sandbox."""
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

    def kill(self) -> None:
        if self.running:
            os.killpg(self._bwrap.pid, signal.SIGKILL)
            self._bwrap.wait()

    def cleanup(self) -> None:
        self.kill()
        shutil.rmtree(self._folder, ignore_errors=True)


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
    args = [str(arg) for arg in container.get("args") or []]
    for mount in container.get("volumeMounts") or []:
        args = [arg.replace(mount["mountPath"], VOLUMES + mount["mountPath"]) for arg in args]
    uid = int((container.get("securityContext") or {}).get("runAsUser") or pod_spec["securityContext"]["runAsUser"])
    return [str(ROCKBOT), *args, *(extra_args or [])], env, uid


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
    (container,) = pod_spec["containers"]
    files = dict(files or {})
    for mount in container.get("volumeMounts") or []:
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
