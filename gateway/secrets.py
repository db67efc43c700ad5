"""Webhook keys, read from the Secrets Triggers name: by name only (`get`), never listed or watched.

A key read is kept `KEEP_SECONDS`, so a burst of deliveries costs one read and a rotated key is
in use within that time. A key that cannot be read is an `Unreadable` naming the fix; the webhook
answers 503 (the sender did nothing wrong) and the Trigger's Ready condition says why.
"""

from __future__ import annotations

import base64
import binascii
import time
from typing import Protocol

from rockbot.kube import SECRETS, ApiError, KubeClient, NotFound
from rockbot.resources.common import SecretKeyRef

KEEP_SECONDS = 30.0


class Unreadable(Exception):
    """The Secret or its key is missing, or the gateway may not read it."""


class Keys(Protocol):
    async def key(self, *, namespace: str, ref: SecretKeyRef) -> bytes:
        """The key's bytes; `Unreadable` naming the fix."""
        ...


class KubeKeys:
    def __init__(self, *, kube: KubeClient, keep_seconds: float = KEEP_SECONDS) -> None:
        self._kube = kube
        self._keep = keep_seconds
        self._read: dict[tuple[str, str, str], tuple[float, bytes]] = {}

    async def key(self, *, namespace: str, ref: SecretKeyRef) -> bytes:
        cached = self._read.get((namespace, ref.name, ref.key))
        if cached is not None and time.monotonic() - cached[0] < self._keep:
            return cached[1]
        try:
            secret = await self._kube.get(SECRETS, namespace=namespace, name=ref.name)
        except NotFound:
            raise Unreadable(f"Secret {ref.name!r} not found in namespace {namespace!r}: create it with the key "
                             f"{ref.key!r} (the webhook's shared secret)") from None  # fmt: skip
        except ApiError as exc:
            raise Unreadable(f"cannot read Secret {ref.name!r} in namespace {namespace!r} ({exc}): the gateway "
                             "needs get on secrets there (chart: gateway namespaces)") from None  # fmt: skip
        encoded = (secret.get("data") or {}).get(ref.key)
        if encoded is None:
            raise Unreadable(f"Secret {ref.name!r} has no key {ref.key!r}: add it, or point secretKeyRef.key at "
                             f"one of: {', '.join(sorted(secret.get('data') or {})) or 'none'}")  # fmt: skip
        try:
            value = base64.b64decode(encoded, validate=True)
        except binascii.Error:
            raise Unreadable(f"Secret {ref.name!r} key {ref.key!r} is not base64") from None
        if not value:
            raise Unreadable(f"Secret {ref.name!r} key {ref.key!r} is empty: an empty key signs nothing")
        self._read[(namespace, ref.name, ref.key)] = (time.monotonic(), value)
        return value


class FixedKeys:
    """Keys given up front (`rockbot local`: the Secret manifests among the files)."""

    def __init__(self, secrets: dict[str, dict[str, str]]) -> None:
        self._secrets = secrets

    async def key(self, *, namespace: str, ref: SecretKeyRef) -> bytes:
        value = self._secrets.get(ref.name, {}).get(ref.key)
        if not value:
            raise Unreadable(f"no Secret {ref.name!r} with a key {ref.key!r} in the files: add a Secret manifest "
                             f"with stringData: {{{ref.key}: ...}}")  # fmt: skip
        return value.encode()
