"""What the operator knows of Secrets it does not watch: their key names, never their values.

The operator may only `get` Secrets (watching them would put every Secret of the namespace in its
memory), so it reads them when that can matter: a read is good enough for an Agent when it was made
after the Agent last changed (`fresh_after`), which the resync pass moves for every Agent. A burst of
new Agents naming one Secret then costs one read, and a settled Agent's reconcile costs none.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field

from rockbot.kube import errors
from rockbot.kube.client import K8sObject, KubeClient
from rockbot.kube.resources import SECRETS
from rockbot.operator.builders import secret_checksum


@dataclass(frozen=True, slots=True)
class SecretFacts:
    """A Secret as read at `read_at` (loop time): its key names (None when it did not exist), a checksum of
    its values (for a pod template annotation; it reveals nothing of them), its labels and owners' uids."""

    read_at: float
    keys: frozenset[str] | None
    checksum: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    owners: frozenset[str] = frozenset()

    def as_found(self) -> K8sObject:
        """The Secret as `secret_refs` judges it: metadata and key names, no values."""
        metadata = {"labels": dict(self.labels), "ownerReferences": [{"uid": uid} for uid in sorted(self.owners)]}
        return {"metadata": metadata, "data": dict.fromkeys(self.keys or (), "")}


class SecretKeys:
    def __init__(self, kube: KubeClient) -> None:
        self._kube = kube
        self._facts: dict[tuple[str, str], SecretFacts] = {}
        self._reading: dict[tuple[str, str], asyncio.Task[SecretFacts]] = {}

    def known(self, namespace: str, name: str, *, fresh_after: float) -> SecretFacts | None:
        """The Secret as read after `fresh_after`, if such a read is known."""
        known = self._facts.get((namespace, name))
        return known if known is not None and known.read_at >= fresh_after else None

    async def facts(self, namespace: str, name: str, *, fresh_after: float) -> SecretFacts:
        """The Secret as read after `fresh_after`, reading it now if no such read is known."""
        key = (namespace, name)
        known = self.known(namespace, name, fresh_after=fresh_after)
        if known is not None:
            return known
        reading = self._reading.get(key)
        if reading is None:  # one read at a time per Secret, shared by every reconcile that waits for it
            reading = self._reading[key] = asyncio.ensure_future(self._read(namespace, name))
            reading.add_done_callback(lambda _: self._reading.pop(key, None))
        return await asyncio.shield(reading)

    def saw(self, namespace: str, secret: K8sObject, *, read_at: float) -> SecretFacts:
        """Take a Secret the operator read or created itself (the request having started at `read_at`)."""
        facts = _facts_of(secret, at=read_at)
        self._facts[(namespace, secret["metadata"]["name"])] = facts
        return facts

    def forget(self, namespace: str, name: str) -> None:
        self._facts.pop((namespace, name), None)

    async def _read(self, namespace: str, name: str) -> SecretFacts:
        started = asyncio.get_running_loop().time()
        try:
            secret = await self._kube.get(SECRETS, namespace=namespace, name=name)
        except errors.NotFound:
            facts = SecretFacts(read_at=started, keys=None, checksum=None)
        else:
            facts = _facts_of(secret, at=started)
        self._facts[(namespace, name)] = facts
        return facts


def _facts_of(secret: K8sObject, *, at: float) -> SecretFacts:
    metadata = secret.get("metadata") or {}
    return SecretFacts(
        read_at=at,
        keys=frozenset(secret.get("data") or {}) | frozenset(secret.get("stringData") or {}),
        checksum=secret_checksum(secret),
        labels=dict(metadata.get("labels") or {}),
        owners=frozenset(ref["uid"] for ref in metadata.get("ownerReferences") or [] if ref.get("uid")),
    )
