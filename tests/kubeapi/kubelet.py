"""A node for the emulator: schedules and runs the pods of one namespace, talking HTTP like any client.

For each new pod it binds the pod to its node (`pods/binding`, the scheduler's write), writes the
pod's first status (Pending, `startTime`), starts its container, and reports the container's states
through `pods/status`. By default the container runs for real: the pod's own command, as a script
pod would run it, under bubblewrap: uid 65534 with no capabilities, PID 1 of a PID namespace of its
own, no network, a read-only root and a private /tmp. Its stdin stays open when the container asks
(`stdin`, `stdinOnce`), and its output becomes the pod's log and the stream of attached clients
(containers.py). A `behaviour` replaces the run to play what a node does to a pod (OOM kills,
images that cannot be pulled).

Like the real kubelet it stops a pod at its `activeDeadlineSeconds` (counted from `startTime`; a
lowered deadline counts) and kills the container when the pod is deleted. With `relist_seconds`
it reports container state changes the way the kubelet's PLEG does, on a periodic relist (the
kubelet's is 1 s): a container that started or ended is seen only at the next tick. `relist()`
reports at once (with `relist_seconds=math.inf`, only then), so a test can hold the reports back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import shutil
import sys
import tempfile
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from rockbot.kube import PODS, ApiError, Gone, KubeClient, NotFound
from tests.kubeapi.clock import now
from tests.kubeapi.containers import Container
from tests.kubeapi.emulator import KubeApiEmulator

log = logging.getLogger(__name__)

Obj = dict[str, Any]
Behaviour = Callable[["FakeKubelet", Obj], Awaitable[None]]
NODE = "emulated-node"
#: The most of a container's termination message the kubelet keeps.
_TERMINATION_MESSAGE_BYTES = 4096


timestamp = now  # as the API server writes them


def pod_sandbox(*, network: bool = False, empty_dirs: tuple[str, ...] = ("/tmp",)) -> list[str]:
    """How a container's process is confined: as a restricted pod under runc would be.

    With `network`, it shares the host's network, as a pod does on a cluster that does not enforce
    NetworkPolicy (the isolation canary's tests). `empty_dirs`: where the pod mounts its emptyDir volumes, each a
    private tmpfs; the root is the host's top folders, read-only, so that a mount point the host lacks (`/output`)
    can be made.

    Not `--die-with-parent` (under pytest it killed sandboxes at random moments) nor `--new-session`:
    the kubelet kills a container through bwrap's process group, which the sandbox's PID 1 stays in
    (killing it ends its PID namespace); a runner whose stdin closes exits by itself.
    """
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        raise RuntimeError("the fake kubelet runs containers under bubblewrap: apt-get install -y bubblewrap")
    root: list[str] = ["--tmpfs", "/"]
    for entry in sorted(os.listdir("/")):
        path = "/" + entry
        if path in ("/proc", "/dev", *empty_dirs):
            continue
        if os.path.islink(path):
            root += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            root += ["--ro-bind", path, path]
    mounts = [arg for path in empty_dirs for arg in ("--tmpfs", path)]
    return [bwrap, "--unshare-user", "--uid", "65534", "--gid", "65534", "--unshare-pid", "--as-pid-1",
            *([] if network else ["--unshare-net"]), "--unshare-ipc", "--unshare-uts",
            *root, "--proc", "/proc", "--dev", "/dev", *mounts, "--remount-ro", "/", "--chdir", "/tmp", "--"]


def _python() -> str:
    """An interpreter uid 65534 can run (the image's `python3`): this one's, unless it lives under /root."""
    real = os.path.realpath(sys.executable)
    return "/usr/bin/python3" if real.startswith("/root/") else real


@dataclass(eq=False)
class RunningPod:
    """What the node knows of one pod: its container's actual state, and what it last reported."""

    name: str
    pod: Obj
    started_at: datetime
    state: Obj = field(default_factory=lambda: {"waiting": {"reason": "ContainerCreating"}})
    phase: str = "Pending"
    reason: str | None = None
    streams: Container | None = None
    process: asyncio.subprocess.Process | None = None
    stdin_received: bytearray = field(default_factory=bytearray)
    deadline: asyncio.Task[None] | None = None
    dirty: bool = False


class FakeKubelet:
    def __init__(
        self,
        *,
        emulator: KubeApiEmulator,
        kube: KubeClient,
        namespace: str,
        behaviour: Behaviour | None = None,
        relist_seconds: float | None = None,
        network: bool = False,
    ) -> None:
        self.emulator = emulator
        self.network = network
        self.kube = kube
        self.namespace = namespace
        self.behaviour = behaviour or run_command
        self.relist_seconds = relist_seconds
        self.seen: list[Obj] = []  # every pod as first seen
        self.pods: dict[str, RunningPod] = {}  # the pods on the node now
        self.history: dict[str, RunningPod] = {}  # every pod the node ran, deleted ones too
        self._tasks: set[asyncio.Task[None]] = set()  # containers being started or run
        self._timers: set[asyncio.Task[None]] = set()  # deadlines and the relist clock

    # ---- what behaviours use

    async def report(self, pod: RunningPod, *, state: Obj, phase: str | None = None, reason: str | None = None,
                     at_once: bool = False) -> None:
        """The container's state changed: reported now, or at the next relist like the real kubelet."""
        pod.state, pod.phase = state, phase or pod.phase
        pod.reason = reason or pod.reason
        pod.dirty = True
        if self.relist_seconds is None or at_once:
            await self._write_status(pod)

    async def run_container(self, pod: RunningPod, *, stdin: Callable[[bytes], None] | None = None) -> None:
        """Start the pod's command for real (see the module docstring) and follow it to its end.

        `stdin`, if given, receives what attached clients write instead of the process (a fault: the
        container dies as the data arrives, say).
        """
        spec = pod.pod["spec"]["containers"][0]
        command = [_python() if part == "python3" else part for part in spec["command"]]
        held_open = asyncio.subprocess.PIPE if spec.get("stdin") else asyncio.subprocess.DEVNULL
        # The container's /dev/termination-log, whose text becomes its terminated state's message (as the kubelet's).
        message = tempfile.NamedTemporaryFile(prefix="rockbot-termination-", delete=False)  # noqa: SIM115
        message.close()
        os.chmod(message.name, 0o666)
        empty = {volume["name"] for volume in pod.pod["spec"].get("volumes") or [] if "emptyDir" in volume}
        mounts = tuple(mount["mountPath"] for mount in spec.get("volumeMounts") or [] if mount["name"] in empty)
        *sandbox, end = pod_sandbox(network=self.network, empty_dirs=mounts or ("/tmp",))
        process = await asyncio.create_subprocess_exec(
            *sandbox, "--bind", message.name, "/dev/termination-log", end, *command, stdin=held_open,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, start_new_session=True,
        )
        pod.process = process
        if pod.name not in self.pods:  # deleted while its container was being made: it is stopped at once
            self.kill(pod)

        async def write(data: bytes) -> None:
            if stdin is not None:
                stdin(data)
                return
            pod.stdin_received += data
            assert process.stdin is not None
            with contextlib.suppress(ConnectionError):
                process.stdin.write(data)
                await process.stdin.drain()

        def close() -> None:
            if process.stdin is not None:
                process.stdin.close()

        pod.streams = Container(write_stdin=write, close_stdin=close, stdin_once=bool(spec.get("stdinOnce")))
        self.emulator.run_container(namespace=self.namespace, name=pod.name, container=spec["name"],
                                    streams=pod.streams)
        await self.report(pod, state={"running": {"startedAt": timestamp()}}, phase="Running")

        async def pump(reader: asyncio.StreamReader, channel: int) -> None:
            while chunk := await reader.read(65536):
                assert pod.streams is not None
                pod.streams.output(channel, chunk)

        assert process.stdout is not None and process.stderr is not None
        await asyncio.gather(pump(process.stdout, 1), pump(process.stderr, 2))
        code = await process.wait()
        pod.streams.exited()
        said = await asyncio.to_thread(_termination_message, message.name)
        if pod.reason == "DeadlineExceeded" or pod.name not in self.pods:
            return
        started = pod.state.get("running", {}).get("startedAt", timestamp())
        await self.report(pod, state={"terminated": {
            "exitCode": code, "reason": "Completed" if code == 0 else "Error",
            "startedAt": started, "finishedAt": timestamp(), **({"message": said} if said else {})}},
            phase="Succeeded" if code == 0 else "Failed")

    def kill(self, pod: RunningPod) -> None:
        """The container's processes die (the node's doing: eviction, OOM of the whole container...)."""
        if pod.process is not None and pod.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pod.process.pid, 9)

    def relist(self) -> None:
        """Report every container state that changed since the last relist, now."""
        for pod in list(self.pods.values()):
            if pod.dirty:
                self._spawn(self._write_status(pod))

    # ---- the node's loop

    async def run(self) -> None:
        """List, then watch from the list's version, like an informer; relist on 410, resume when a stream ends."""
        if self.relist_seconds is not None and math.isfinite(self.relist_seconds):
            self._timer(self._relist_forever())
        try:
            while True:
                listed = await self.kube.list(PODS, namespace=self.namespace)
                for obj in listed.items:
                    self._admit(obj)
                version = listed.resource_version
                with contextlib.suppress(Gone):
                    while True:
                        async for event in self.kube.watch(PODS, namespace=self.namespace, resource_version=version,
                                                           timeout_seconds=60):
                            version = event.object["metadata"]["resourceVersion"]
                            if event.type == "ADDED":
                                self._admit(event.object)
                            elif event.type == "MODIFIED":
                                self._changed(event.object)
                            elif event.type == "DELETED":
                                self._deleted(event.object["metadata"]["name"])
        finally:
            for timer in self._timers:
                timer.cancel()
            for pod in list(self.pods.values()):
                self._deleted(pod.name)
            if self._tasks:  # killed containers end their runs by themselves; anything else is cancelled
                await asyncio.wait(set(self._tasks), timeout=5)
            for task in [*self._tasks, *self._timers]:  # a pod still starting may have set its deadline meanwhile
                task.cancel()
            await asyncio.gather(*self._tasks, *self._timers, return_exceptions=True)

    def _spawn(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _timer(self, work: Awaitable[None]) -> asyncio.Task[None]:
        task = asyncio.ensure_future(work)
        self._timers.add(task)
        task.add_done_callback(self._done)
        return task

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._timers.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("the fake kubelet failed", exc_info=task.exception())

    def _admit(self, obj: Obj) -> None:
        name = obj["metadata"]["name"]
        if name in self.pods:
            return
        self.seen.append(obj)
        pod = RunningPod(name=name, pod=obj, started_at=datetime.now(UTC))
        self.pods[name] = self.history[name] = pod
        self._spawn(self._start(pod))

    async def _start(self, pod: RunningPod) -> None:
        try:
            await self.kube.create(PODS, namespace=self.namespace, name=pod.name, subresource="binding", body={
                "apiVersion": "v1", "kind": "Binding", "metadata": {"name": pod.name},
                "target": {"apiVersion": "v1", "kind": "Node", "name": NODE}})
            await self._write_status(pod)
            self._watch_deadline(pod)
            await self.behaviour(self, pod)
        except NotFound:  # deleted before it ran
            self._deleted(pod.name)

    def _changed(self, obj: Obj) -> None:
        pod = self.pods.get(obj["metadata"]["name"])
        if pod is None:
            return
        before = (pod.pod.get("spec") or {}).get("activeDeadlineSeconds")
        pod.pod = obj
        if (obj.get("spec") or {}).get("activeDeadlineSeconds") != before:
            self._watch_deadline(pod)

    def _deleted(self, name: str) -> None:
        pod = self.pods.pop(name, None)
        if pod is None:
            return
        if pod.deadline is not None:
            pod.deadline.cancel()
        self.kill(pod)

    def _watch_deadline(self, pod: RunningPod) -> None:
        seconds = (pod.pod.get("spec") or {}).get("activeDeadlineSeconds")
        if pod.deadline is not None:
            pod.deadline.cancel()
        if seconds is None:
            return
        left = seconds - (datetime.now(UTC) - pod.started_at).total_seconds()

        async def stop() -> None:
            await asyncio.sleep(max(left, 0))
            if pod.phase in ("Succeeded", "Failed") or pod.name not in self.pods:
                return
            started = pod.state.get("running", {}).get("startedAt")
            state = ({"terminated": {"exitCode": 137, "reason": "Error", "startedAt": started,
                                     "finishedAt": timestamp()}} if started else pod.state)
            await self.report(pod, state=state, phase="Failed", reason="DeadlineExceeded", at_once=True)
            self.kill(pod)

        pod.deadline = self._timer(stop())

    async def _relist_forever(self) -> None:
        assert self.relist_seconds is not None
        while True:
            await asyncio.sleep(self.relist_seconds)
            self.relist()

    async def _write_status(self, pod: RunningPod) -> None:
        pod.dirty = False
        status: Obj = {"phase": pod.phase, "startTime": pod.started_at.strftime("%Y-%m-%dT%H:%M:%SZ"),
                       "containerStatuses": [{"name": pod.pod["spec"]["containers"][0]["name"], "state": pod.state,
                                              "ready": "running" in pod.state}]}
        if pod.reason:
            status["reason"] = pod.reason
        with contextlib.suppress(NotFound):
            try:
                await self.kube.patch(PODS, namespace=self.namespace, name=pod.name, subresource="status",
                                      body={"status": status})
            except ApiError:
                pod.dirty = True  # the next relist tries again


def _termination_message(path: str) -> str:
    """What the container wrote to /dev/termination-log (its first 4 KiB, as the kubelet keeps), file removed."""
    with open(path, "rb") as written:
        said = written.read(_TERMINATION_MESSAGE_BYTES).decode(errors="replace")
    os.unlink(path)
    return said


async def run_command(kubelet: FakeKubelet, pod: RunningPod) -> None:
    """The default behaviour: run the container's command for real."""
    await kubelet.run_container(pod)


