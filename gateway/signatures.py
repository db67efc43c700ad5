"""Webhook signatures: an HMAC-SHA256 of the raw body under a shared key, compared in constant time."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac

from rockbot.resources.trigger import WebhookSignature


def digest(*, key: bytes, body: bytes) -> bytes:
    return hmac.new(key, body, hashlib.sha256).digest()


def verify(*, key: bytes, body: bytes, header_value: str | None, signature: WebhookSignature) -> bool:
    """Whether `header_value` is `signature.prefix` followed by the body's HMAC in `signature.encoding`."""
    if header_value is None or not header_value.startswith(signature.prefix):
        return False
    encoded = header_value[len(signature.prefix) :].strip()
    try:
        given = bytes.fromhex(encoded) if signature.encoding == "hex" else base64.b64decode(encoded, validate=True)
    except (ValueError, binascii.Error):
        return False
    return hmac.compare_digest(given, digest(key=key, body=body))
