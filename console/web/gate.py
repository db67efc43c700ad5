"""The door of every console request: who is asking (proxy headers, a bearer token, or a session cookie),
and whether a state-changing request really comes from the console's own pages (CSRF).

Pages without an identity go to the login page; JSON and streams answer 401. The identity found is
`request[IDENTITY]`; the principal its CSRF token is derived from is `request[CSRF_PRINCIPAL]` (None
for a bearer token in the Authorization header, which a browser never sends on its own).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web

from rockbot.console.auth_sessions import COOKIE_NAME, CSRF_FIELD, CSRF_HEADER, Sessions, cross_site
from rockbot.console.authentication import Identity, ProxyHeaders, TokenReviewer, Unauthenticated

log = logging.getLogger(__name__)

IDENTITY = web.RequestKey("identity", Identity)
CSRF_PRINCIPAL: web.RequestKey[str | None] = web.RequestKey("csrf_principal")
#: Paths anyone may reach: the login page and the console's own static files.
PUBLIC_PREFIXES = ("/login", "/static/", "/healthz")
_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True, kw_only=True)
class Gate:
    """How the console knows its users: the token reviewer, its sessions, and the proxy it trusts (if any)."""

    tokens: TokenReviewer | None
    sessions: Sessions
    proxy: ProxyHeaders | None = None
    #: `rockbot local`: everyone who reaches the port is this user (the port listens on loopback only).
    local_identity: Identity | None = None

    async def who(self, request: web.Request) -> tuple[Identity, str | None]:
        """The identity of a request and its CSRF principal; `Unauthenticated` when it proves none."""
        if self.local_identity is not None:
            return self.local_identity, "local"
        if self.proxy is not None:
            found = self.proxy.identity(peer=request.remote, headers=request.headers)
            if found is not None:
                return found, f"proxy:{found.username}"
        if self.tokens is None:
            raise Unauthenticated("this console only takes users through its authenticating proxy")
        authorization = request.headers.get("Authorization", "")
        if authorization:
            scheme, _, token = authorization.partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                raise Unauthenticated("the Authorization header must be 'Bearer <token>'")
            return await self.tokens.identity(token), None
        session = self.sessions.find(request.cookies.get(COOKIE_NAME))
        if session is None:
            raise Unauthenticated("log in with a token")
        try:
            return await self.tokens.identity(session.token), session.id
        except Unauthenticated:
            self.sessions.end(session.id)
            raise

    def middleware(self) -> Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]:
        @web.middleware
        async def gate(request: web.Request, handler: Handler) -> web.StreamResponse:
            unsafe = request.method not in _SAFE_METHODS
            if unsafe and (why := cross_site(headers=request.headers, host=request.host)):
                log.warning("refused a cross-site %s %s: %s", request.method, request.path, why)
                raise web.HTTPForbidden(text=f"cross-site request refused: {why}")
            if request.path == "/" or not request.path.startswith(PUBLIC_PREFIXES):
                try:
                    identity, principal = await self.who(request)
                except Unauthenticated as exc:
                    if _wants_html(request) and not unsafe:
                        raise web.HTTPSeeOther(location="/login") from exc
                    raise web.HTTPUnauthorized(text=f"not logged in: {exc}") from exc
                request[IDENTITY] = identity
                request[CSRF_PRINCIPAL] = principal
                if unsafe and principal is not None:
                    await _check_csrf(request, sessions=self.sessions, principal=principal)
            return await handler(request)

        return gate


async def _check_csrf(request: web.Request, *, sessions: Sessions, principal: str) -> None:
    given = request.headers.get(CSRF_HEADER)
    if given is None and request.content_type in ("application/x-www-form-urlencoded", "multipart/form-data"):
        given = str((await request.post()).get(CSRF_FIELD) or "") or None
    if not sessions.csrf_valid(principal=principal, given=given):
        raise web.HTTPForbidden(text="missing or wrong CSRF token: reload the page and try again")


def _wants_html(request: web.Request) -> bool:
    return "text/html" in request.headers.get("Accept", "")
