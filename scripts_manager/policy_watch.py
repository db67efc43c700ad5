"""Re-prove isolation when the scripts namespace's NetworkPolicies change, not only every interval.

A policy deleted or loosened (a `helm upgrade`, a hand edit) may open a route the last canary did not
see, and one added may close it: either way the last proof no longer describes the cluster. So the
manager mirrors the NetworkPolicies of its scripts namespace (`rockbot.kube.mirroring`: list, watch,
list again after a 410) and tells its canary about every change (the canary waits for a quiet moment,
so a burst is one proof). A relist that finds what changed while not watched reports it too.

Rights: networkpolicies list and watch in the scripts namespace, nothing else (chart RBAC). Without
them (an older chart's Role) the manager logs why once and proves every interval, as before.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from rockbot.kube import NETWORKPOLICIES, ApiError, KubeClient
from rockbot.kube.mirroring import mirror

log = logging.getLogger(__name__)


class PolicyWatch:
    """The NetworkPolicies of one namespace, by name and resourceVersion; `listed` once they were first read."""

    def __init__(self, *, kube: KubeClient, namespace: str) -> None:
        self._kube = kube
        self._namespace = namespace
        self.listed = asyncio.Event()

    async def run(self, on_change: Callable[[str], None]) -> None:
        """Call `on_change(why)` for every change after the first list, until cancelled."""
        known: dict[str, str] = {}

        def upserted(body: dict[str, Any]) -> None:
            metadata = body["metadata"]
            if known.get(metadata["name"]) != metadata["resourceVersion"]:
                known[metadata["name"]] = metadata["resourceVersion"]
                if self.listed.is_set():
                    on_change(f"NetworkPolicy {self._namespace}/{metadata['name']} changed")

        def deleted(_namespace: str, name: str) -> None:
            if known.pop(name, None) is not None and self.listed.is_set():
                on_change(f"NetworkPolicy {self._namespace}/{name} deleted")

        try:
            await mirror(kube=self._kube, resource=NETWORKPOLICIES, namespace=self._namespace, on_upsert=upserted,
                         on_delete=deleted, on_synced=self.listed.set, forbidden_ends=True)  # fmt: skip
        except ApiError as exc:
            log.error("cannot watch the NetworkPolicies of %s (%s): the isolation canary runs every interval only; "
                      "give the scripts-manager networkpolicies list and watch there (chart RBAC)",
                      self._namespace, exc)
            self.listed.set()
