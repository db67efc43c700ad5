"""Browser sessions of the console and their CSRF tokens.

The login page takes a token once; the console keeps it server-side under a random session id, which
is all the cookie holds (`__Host-` prefix: HttpOnly, Secure, SameSite=Strict, Path=/, no Domain).
Every request reviews the kept token again (TokenReview, cached seconds), so a revoked token ends its
session within a minute. Sessions live in this process: a restart logs everyone out, and more than one
replica needs sticky sessions (the chart runs one).

A state-changing request must carry the session's CSRF token (form field `csrf` or header
`X-CSRF-Token`) and must not come from another site (`Sec-Fetch-Site`, `Origin`).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from rockbot.console.authentication import Identity

COOKIE_NAME = "__Host-rockbot-console"
CSRF_FIELD = "csrf"
CSRF_HEADER = "X-CSRF-Token"
#: A session ends this long after login, and after this long unused.
MAX_AGE_SECONDS = 8 * 3600
IDLE_SECONDS = 3600
MAX_SESSIONS = 10_000


@dataclass(kw_only=True)
class Session:
    id: str
    token: str
    username: str
    started: float
    last_seen: float


class Sessions:
    """The logged-in browsers of this process, by random id; the oldest go first past `MAX_SESSIONS`."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._by_id: OrderedDict[str, Session] = OrderedDict()
        self._csrf_key = secrets.token_bytes(32)

    def start(self, *, token: str, identity: Identity) -> Session:
        now = self._clock()
        session = Session(id=secrets.token_urlsafe(32), token=token, username=identity.username, started=now,
                          last_seen=now)
        self._by_id[session.id] = session
        while len(self._by_id) > MAX_SESSIONS:
            self._by_id.popitem(last=False)
        return session

    def find(self, session_id: str | None) -> Session | None:
        """The live session of this id (its idle clock restarted), None when unknown or expired."""
        if not session_id:
            return None
        session = self._by_id.get(session_id)
        if session is None:
            return None
        now = self._clock()
        if now - session.started > MAX_AGE_SECONDS or now - session.last_seen > IDLE_SECONDS:
            self.end(session_id)
            return None
        session.last_seen = now
        self._by_id.move_to_end(session_id)
        return session

    def end(self, session_id: str) -> None:
        self._by_id.pop(session_id, None)

    def csrf_token(self, *, principal: str) -> str:
        """The CSRF token of a session id (or of a proxy user): derived, so nothing more is stored."""
        return hmac.new(self._csrf_key, principal.encode(), hashlib.sha256).hexdigest()

    def csrf_valid(self, *, principal: str, given: str | None) -> bool:
        return bool(given) and hmac.compare_digest(self.csrf_token(principal=principal), given or "")


def cross_site(*, headers: Mapping[str, str], host: str | None) -> str | None:
    """Why a state-changing request looks sent by another site, or None.

    Browsers say where a request comes from (`Sec-Fetch-Site`, `Origin`); either naming another site
    refuses it, even with a valid CSRF token.
    """
    fetch_site = headers.get("Sec-Fetch-Site")
    if fetch_site is not None and fetch_site not in ("same-origin", "none"):
        return f"Sec-Fetch-Site is {fetch_site!r}"
    origin = headers.get("Origin")
    if origin is not None:
        if origin == "null" or not host:
            return f"Origin is {origin!r}"
        if origin.split("://", 1)[-1] != host:
            return f"Origin {origin!r} is not this console ({host})"
    return None
