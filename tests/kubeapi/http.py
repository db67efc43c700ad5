"""Raw HTTP calls to the emulator for its contract tests: status codes and bodies as a client sees them."""

import json
from typing import Any

from tests.kubeapi import KubeApiEmulator

MERGE = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
CM = "/api/v1/namespaces/default/configmaps"


async def call(
    emulator: KubeApiEmulator,
    method: str,
    path: str,
    body: Any = None,
    *,
    content_type: str = "application/json",
) -> tuple[int, Any]:
    """Send one request; returns the status code and the decoded JSON (or text) answer."""
    data = None if body is None else json.dumps(body)
    async with emulator.request(method, path, data=data, headers={"Content-Type": content_type}) as response:
        text = await response.text()
        try:
            return response.status, json.loads(text)
        except ValueError:
            return response.status, text


async def watch(emulator: KubeApiEmulator, path: str) -> list[tuple[str, Any]]:
    """Read a whole watch stream (the path must make it end: timeoutSeconds or an error)."""
    async with emulator.request("GET", path) as response:
        assert response.status == 200, await response.text()
        events = [json.loads(line) async for line in response.content if line.strip()]
    return [(event["type"], event["object"]) for event in events]


def names(events: list[tuple[str, Any]]) -> list[tuple[str, str]]:
    return [(type_, obj["metadata"]["name"]) for type_, obj in events]
