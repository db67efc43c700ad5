"""What every console page does: render a template for the user (with their CSRF token), and refuse what RBAC
does not allow."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import jinja2
from aiohttp import web

from rockbot.console.auth_sessions import CSRF_FIELD, Sessions
from rockbot.console.authentication import Identity
from rockbot.console.authorization import Action, Authorizer
from rockbot.console.web.gate import CSRF_PRINCIPAL, IDENTITY

HERE = Path(__file__).parent
TEMPLATES = web.AppKey("templates", jinja2.Environment)


def templates() -> jinja2.Environment:
    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        auto_reload=False,  # the package's own files: no stat of each template on every page
    )
    environment.filters["pretty_json"] = lambda value: json.dumps(value, indent=2, sort_keys=True, default=str)
    versions = {path.name: hashlib.sha256(path.read_bytes()).hexdigest()[:12] for path in (HERE / "static").iterdir()}
    environment.globals["static"] = lambda name: f"/static/{name}?v={versions[name]}"
    return environment


class Pages:
    def __init__(self, *, sessions: Sessions, authorizer: Authorizer) -> None:
        self.sessions = sessions
        self.authorizer = authorizer

    def render(self, request: web.Request, template: str, *, status: int = 200, **context: Any) -> web.Response:
        principal = request.get(CSRF_PRINCIPAL)
        identity: Identity | None = request.get(IDENTITY)
        page = request.app[TEMPLATES].get_template(template).render(
            user=identity.username if identity else None,
            csrf=self.sessions.csrf_token(principal=principal) if principal else "",
            csrf_field=CSRF_FIELD,
            can_log_out=principal is not None and not principal.startswith(("proxy:", "local")),
            **context,
        )
        return web.Response(text=page, status=status, content_type="text/html")

    async def require(self, request: web.Request, *, namespace: str, action: Action) -> None:
        """403 unless the user may do `action` in `namespace` (the same answer whether or not the object exists)."""
        if not await self.authorizer.allowed(identity=request[IDENTITY], namespace=namespace, action=action):
            raise web.HTTPForbidden(
                text=f"{request[IDENTITY].username} may not {action.describe()} in namespace {namespace} "
                f"(ask for a Role granting it)")
