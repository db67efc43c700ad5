"""Timestamps as the API server writes them (RFC 3339, seconds, UTC)."""

import datetime


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
