"""A local HTTP server playing the OpenRouter API, and the MCP server run as its own process against it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from tests.ports import free_port

API_KEY = "sk-or-v1-test-key-0123456789"
MANAGEMENT_KEY = "sk-or-v1-management-key-9876543210"

MODELS = [
    {"id": "openai/gpt-4o-mini", "name": "OpenAI: GPT-4o-mini", "context_length": 128000,
     "pricing": {"prompt": "0.00000015", "completion": "0.0000006", "request": "0", "image": "0.000217"},
     "top_provider": {"context_length": 128000, "max_completion_tokens": 16384, "is_moderated": True}},
    {"id": "anthropic/claude-3.5-haiku", "name": "Anthropic: Claude 3.5 Haiku", "context_length": 200000,
     "pricing": {"prompt": "0.0000008", "completion": "0.000004", "request": "0"},
     "top_provider": {"context_length": 200000, "max_completion_tokens": 8192}},
    {"id": "openai/gpt-4o", "name": "OpenAI: GPT-4o", "context_length": 128000,
     "pricing": {"prompt": "0.0000025", "completion": "0.00001", "request": "0"},
     "top_provider": {"context_length": 128000, "max_completion_tokens": 16384}},
]

GENERATION = {
    "id": "gen-1234", "model": "openai/gpt-4o-mini", "provider_name": "OpenAI", "created_at": "2026-11-20T10:00:00Z",
    "tokens_prompt": 120, "tokens_completion": 30, "native_tokens_prompt": 118, "native_tokens_completion": 31,
    "native_tokens_reasoning": 0, "total_cost": 0.0000363, "cache_discount": None, "latency": 412.0,
    "generation_time": 820.0, "finish_reason": "stop", "upstream_id": "chatcmpl-xyz",
}

KEYS = [
    {"hash": "f01d52606dc8f0a8303a7b5cc3fa07109c2e346cec7c0a16b40de462992ce943", "name": "agents", "label":
     "sk-or-v1-f01...943", "disabled": False, "limit": 100.0, "limit_remaining": 74.5, "limit_reset": "monthly",
     "include_byok_in_limit": False, "usage": 25.5, "usage_daily": 1.5, "usage_weekly": 8.0, "usage_monthly": 25.5,
     "created_at": "2026-08-24T10:30:00Z", "updated_at": "2026-11-20T15:45:00Z"},
    {"hash": "0e6f44a47a05f1dad2ad7e88c4c1d6b77688157716fb1a5271146f7464951c96", "name": "old", "label":
     "sk-or-v1-0e6...c96", "disabled": True, "limit": None, "limit_remaining": None, "limit_reset": None,
     "usage": 3.25, "created_at": "2025-01-02T00:00:00Z", "updated_at": None},
]
MANAGEMENT: dict[str, Any] = {"/api/v1/keys": {"data": KEYS}} | {f"/api/v1/keys/{key['hash']}": {"data": key}
                                                                  for key in KEYS}

ANSWERS: dict[str, Any] = {
    "/api/v1/credits": {"data": {"total_credits": 50.0, "total_usage": 12.5}},
    "/api/v1/key": {"data": {"label": "sk-or-v1-012...789", "limit": 20.0, "limit_remaining": 7.5, "usage": 12.5,
                             "usage_daily": 0.5, "usage_weekly": 3.0, "usage_monthly": 12.5, "is_free_tier": False,
                             "rate_limit": {"requests": 200, "interval": "10s"}}},
    "/api/v1/models": {"data": MODELS},
}


class FakeOpenRouter:
    """Answers the read-only OpenRouter endpoints on 127.0.0.1 and records every request it gets."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, str | None]] = []  # (method, path with query, Authorization)
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _answer(self, status: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                fake.requests.append(("GET", self.path, self.headers.get("Authorization")))
                url = urlsplit(self.path)
                if url.path.startswith("/api/v1/keys"):  # key management answers the management key only
                    if self.headers.get("Authorization") != f"Bearer {MANAGEMENT_KEY}":
                        return self._answer(401, {"error": {"code": 401, "message": "Invalid management key"}})
                    if url.path in MANAGEMENT:
                        return self._answer(200, MANAGEMENT[url.path])
                    return self._answer(404, {"error": {"code": 404, "message": "Key not found"}})
                if self.headers.get("Authorization") != f"Bearer {API_KEY}":
                    return self._answer(401, {"error": {"code": 401, "message": "No auth credentials found"}})
                if url.path == "/api/v1/generation":
                    if parse_qs(url.query).get("id") == [GENERATION["id"]]:
                        return self._answer(200, {"data": GENERATION})
                    return self._answer(404, {"error": {"code": 404, "message": "Generation not found"}})
                if url.path in ANSWERS:
                    return self._answer(200, ANSWERS[url.path])
                return self._answer(404, {"error": {"code": 404, "message": "Not Found"}})

            def _refuse(self) -> None:
                fake.requests.append((self.command, self.path, self.headers.get("Authorization")))
                self._answer(405, {"error": {"code": 405, "message": "read-only fake"}})

            do_POST = do_PUT = do_PATCH = do_DELETE = _refuse

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.httpd.server_address[1]}/api/v1"


@pytest.fixture(scope="package")
def openrouter() -> Iterator[FakeOpenRouter]:
    fake = FakeOpenRouter()
    thread = threading.Thread(target=fake.httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield fake
    finally:
        fake.httpd.shutdown()
        fake.httpd.server_close()


def run_cli(*args: str, env: dict[str, str]) -> subprocess.Popen[str]:
    """`rockbot openrouter-mcp ARGS` in its own process, as the chart's pod runs it."""
    return subprocess.Popen([sys.executable, "-m", "rockbot.cli", "openrouter-mcp", *args], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


@pytest.fixture(scope="package")
def mcp_url(openrouter: FakeOpenRouter) -> Iterator[str]:
    """The MCP server as a process (the same CLI the pod runs), pointed at the fake OpenRouter."""
    port = free_port()
    env = {**os.environ, "OPENROUTER_API_KEY": API_KEY, "OPENROUTER_MANAGEMENT_KEY": MANAGEMENT_KEY,
           "OPENROUTER_BASE_URL": openrouter.base_url}
    process = run_cli("--host", "127.0.0.1", "--port", str(port), env=env)
    try:
        deadline = time.monotonic() + 30
        while True:
            if process.poll() is not None:
                pytest.fail(f"the MCP server exited with {process.returncode}: {process.stderr.read()}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail("the MCP server did not listen within 30 s")
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.terminate()
        try:
            process.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
