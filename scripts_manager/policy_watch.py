"""Re-prove isolation when the scripts namespace's NetworkPolicies change, not only every interval.

A policy deleted or loosened (a `helm upgrade`, a hand edit) may open a route the last canary did not
see, and one added may close it: either way the last proof no longer describes the cluster. So the
manager lists the NetworkPolicies of its scripts namespace, watches them from that list, and tells
its canary about every change (the canary waits for a quiet moment, so a burst is one proof). A watch
that expired (410) is listed again, and a list that differs from what was known is a change too.

Rights: networkpolicies list and watch in the scripts namespace, nothing else (chart RBAC). Without
them (an older chart's Role) the manager logs why once and proves every interval, as before.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import aiohttp

from rockbot.kube import NETWORKPOLICIES, ApiError, Gone, KubeClient

log = logging.getLogger(__name__)

#: Pause before listing again after an error the API server may recover from.
RETRY_SECONDS = 10.0
#: How long one watch request stays open before it is renewed.
WATCH_SECONDS = 300


class PolicyWatch:
    """The NetworkPolicies of one namespace, by name and resourceVersion; `listed` once they were first read."""

    def __init__(self, *, kube: KubeClient, namespace: str) -> None:
        self._kube = kube
        self._namespace = namespace
        self.listed = asyncio.Event()

    async def run(self, on_change: Callable[[str], None]) -> None:
        """Call `on_change(why)` for every change after the first list, until cancelled."""
        known: dict[str, str] | None = None
        while True:
            try:
                listing = await self._kube.list(NETWORKPOLICIES, namespace=self._namespace)
                found = {item["metadata"]["name"]: item["metadata"]["resourceVersion"] for item in listing.items}
                if known is not None and found != known:
                    on_change(f"the NetworkPolicies of {self._namespace} changed while not watched")
                known = found
                self.listed.set()
                await self._follow(known, listing.resource_version, on_change)
            except Gone:
                continue  # the watch's version is compacted away: list again
            except ApiError as exc:
                if exc.status in (401, 403):
                    log.error("cannot watch the NetworkPolicies of %s (%s): the isolation canary runs every interval "
                              "only; give the scripts-manager networkpolicies list and watch there (chart RBAC)",
                              self._namespace, exc)
                    self.listed.set()
                    return
                await self._pause(exc)
            except (OSError, aiohttp.ClientError) as exc:
                await self._pause(exc)

    async def _follow(self, known: dict[str, str], version: str, on_change: Callable[[str], None]) -> None:
        while True:
            async for event in self._kube.watch(NETWORKPOLICIES, namespace=self._namespace, resource_version=version,
                                                timeout_seconds=WATCH_SECONDS):  # fmt: skip
                metadata = event.object["metadata"]
                version = metadata["resourceVersion"]
                if event.type == "BOOKMARK":
                    continue
                name = metadata["name"]
                if event.type == "DELETED":
                    known.pop(name, None)
                elif known.get(name) == version:
                    continue
                else:
                    known[name] = version
                on_change(f"NetworkPolicy {self._namespace}/{name} {event.type.lower()}")

    async def _pause(self, exc: BaseException) -> None:
        log.warning("watching the NetworkPolicies of %s failed (%s); listing again in %g s", self._namespace, exc,
                    RETRY_SECONDS)
        self.listed.set()  # the canary need not wait for a list that fails
        await asyncio.sleep(RETRY_SECONDS)
