"""REST-backed Tools: an HTTP endpoint becomes a tool the model can call.

The URL is an RFC 6570 template (`https://api.example/v1/cities/{city}/weather{?units}`),
expanded with `uritemplate`, so every value is percent-encoded: a model cannot smuggle `/`,
`?` or `#` into a path segment. Arguments not used by the template travel as the JSON body for
POST/PUT/PATCH and as query parameters for GET/DELETE. Auth is a bearer token or an API-key
header whose value comes from an env var the operator wired from a Secret; it is read at call
time and never logged. The expanded URL is sent exactly as built (no re-quoting).
429 and 5xx answers are reported as retryable. Where a cluster administrator said which non-public networks Tools
may reach (`AgentConfig.private_networks`, the chart's `agents.privateNetworks`), every address a call connects to
is checked where it connects, redirects and names that resolve inside the cluster included (`egress`): a Tool's
author chooses its URL, not what it may reach.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp
from uritemplate import URITemplate
from yarl import URL

from rockbot.agent.egress import AddressRefused, EgressPolicy
from rockbot.agent.registry import ToolContext, ToolFailure
from rockbot.agent.toolsets.kit import HTTP_TOOL_TIMEOUT_SECONDS, ToolKit
from rockbot.contracts.agent_config import ResolvedTool, RestBackend
from rockbot.contracts.errors import ErrorCode

MAX_RESPONSE_BYTES = 2 * 1024 * 1024


def rest_tool(resolved: ResolvedTool, *, kit: ToolKit):
    backend = resolved.backend
    assert isinstance(backend, RestBackend)
    template = URITemplate(backend.url)
    template_names = set(template.variable_names)
    checked: list[aiohttp.ClientSession] = []  # made on the first call, when a cluster administrator limits Tools

    async def session() -> aiohttp.ClientSession:
        networks = kit.config.private_networks
        if networks is None:
            return await kit.http()
        if not checked:
            checked.append(aiohttp.ClientSession(
                connector=EgressPolicy(allowed_networks=networks).connector(),
                timeout=aiohttp.ClientTimeout(total=HTTP_TOOL_TIMEOUT_SECONDS), headers={"User-Agent": "rockbot-agent"},
            ))  # fmt: skip
            kit.closers.append(checked[0].close)
        return checked[0]

    async def execute(args: dict[str, Any], context: ToolContext) -> str:
        url = template.expand({k: v for k, v in args.items() if k in template_names})
        rest = {k: v for k, v in args.items() if k not in template_names}
        headers = {"Accept": "application/json, text/plain;q=0.9, */*;q=0.5", **backend.headers}
        if backend.auth is not None:
            secret = kit.secret(backend.auth.value.env)
            if secret is None:
                raise ToolFailure(
                    f"tool {resolved.name!r} needs a credential in env var {backend.auth.value.env}, which is empty; "
                    "check the Secret referenced by the Tool's auth",
                    code=ErrorCode.UNAVAILABLE,
                )
            headers[backend.auth.header_name] = f"Bearer {secret}" if backend.auth.type == "bearer" else secret
        request: dict[str, Any] = {"headers": headers}
        if backend.method in ("POST", "PUT", "PATCH"):
            request["json"] = rest
        elif rest:
            request["params"] = {k: _query_value(v) for k, v in rest.items()}
        try:
            async with (await session()).request(backend.method, URL(url, encoded=True), **request) as response:
                body = await response.content.read(MAX_RESPONSE_BYTES)
                text = body.decode(response.charset or "utf-8", errors="replace")
                if response.status >= 400:
                    retryable = response.status == 429 or response.status >= 500
                    raise ToolFailure(
                        f"{backend.method} {_without_query(url)} answered HTTP {response.status}: {text[:500]}",
                        code=ErrorCode.UNAVAILABLE if retryable else ErrorCode.EXECUTION_FAILED,
                        retryable=retryable,
                    )
                return text or f"HTTP {response.status} (empty body)"
        except aiohttp.ClientError as exc:
            refused = exc.os_error if isinstance(exc, aiohttp.ClientConnectorError) else None
            if isinstance(refused, AddressRefused):
                raise ToolFailure(
                    f"{_without_query(url)} (or a redirect from it) leads to {refused.address}, {refused.reason}, "
                    f"which a cluster administrator has not opened to Tools (the chart's agents.privateNetworks): "
                    "the call was not made", code=ErrorCode.REJECTED,
                ) from exc  # fmt: skip
            raise ToolFailure(
                f"cannot reach {_without_query(url)}: {exc}", code=ErrorCode.UNAVAILABLE, retryable=True
            ) from exc

    return execute


def _query_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict | list):
        return json.dumps(value)
    return str(value)


def _without_query(url: str) -> str:
    return url.split("?", 1)[0]
