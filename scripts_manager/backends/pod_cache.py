"""The warm pool's view of its pods: one list-and-watch of the pool's pods, kept in memory.

Like an informer: list, then watch from the list's resourceVersion; a stream that ends is resumed
from the last version seen, a 410 (history compacted) or a broken connection lists again. Readers
get the pods as the API server last showed them and a way to wait for the next change.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import aiohttp

from rockbot.kube import PODS, ApiError, Gone, K8sObject, KubeClient

log = logging.getLogger(__name__)

_WATCH_SECONDS = 60
_RETRY_SECONDS = 1.0


class PodCache:
    def __init__(self, *, kube: KubeClient, namespace: str, selector: str) -> None:
        self._kube = kube
        self._namespace = namespace
        self._selector = selector
        self.pods: dict[str, K8sObject] = {}
        self.synced = asyncio.Event()
        self.version = 0  # counts changes, so a reader can wait for one after what it last saw
        self._changed = asyncio.Condition()

    def remember(self, pod: K8sObject) -> None:
        """A pod this process just created: known at once, until the watch brings its next state."""
        self.pods.setdefault(pod["metadata"]["name"], pod)
        self.notify()

    def notify(self) -> None:
        self.version += 1
        asyncio.get_running_loop().create_task(self._wake())

    async def _wake(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def changed(self, *, since: int, within: float) -> None:
        """Return once `version` has passed `since` (at once if it has), or after `within` seconds."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(within), self._changed:
                await self._changed.wait_for(lambda: self.version > since)

    async def run(self) -> None:
        """Keep `pods` current until cancelled."""
        while True:
            try:
                listed = await self._kube.list(PODS, namespace=self._namespace, label_selector=self._selector)
                self.pods = {pod["metadata"]["name"]: pod for pod in listed.items}
                self.synced.set()
                self.notify()
                version = listed.resource_version
                while True:
                    async for event in self._kube.watch(
                        PODS, namespace=self._namespace, label_selector=self._selector,
                        resource_version=version, timeout_seconds=_WATCH_SECONDS,
                    ):  # fmt: skip
                        pod = event.object
                        version = pod["metadata"]["resourceVersion"]
                        if event.type == "DELETED":
                            self.pods.pop(pod["metadata"]["name"], None)
                        elif event.type in ("ADDED", "MODIFIED"):
                            self.pods[pod["metadata"]["name"]] = pod
                        self.notify()
            except Gone:
                log.info("the pool's watch expired; listing again")
            except (ApiError, aiohttp.ClientError, OSError) as exc:
                log.warning("watching the pool's pods failed (%s); listing again in %g s", exc, _RETRY_SECONDS)
                await asyncio.sleep(_RETRY_SECONDS)
