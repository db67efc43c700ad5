"""Who a console request comes from, as the cluster says: a bearer token the API server accepts
(TokenReview), or the identity headers of an authenticating proxy, only when that is enabled and only
from the proxy's own addresses.

The console never decides who someone is from what the browser wrote: a token is the API server's
word (a user's token, a ServiceAccount token, an OIDC ID token the cluster trusts), and proxy headers
count only from a peer address the chart names. Answers are kept a few seconds (never over a minute)
so a revoked token stops working soon without a TokenReview per request.
"""

from __future__ import annotations

import hashlib
import ipaddress
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from rockbot.kube import TOKEN_REVIEWS, ApiError, KubeClient

#: The longest any answer of the API server about a token or a right is kept.
MAX_CACHE_SECONDS = 60.0
#: Tokens whose review is kept at once; the oldest go first (only accepted tokens are kept).
MAX_CACHED_TOKENS = 10_000
#: The headers oauth2-proxy (and most authenticating proxies) set for the user it logged in.
PROXY_USER_HEADER = "X-Forwarded-User"
PROXY_GROUPS_HEADER = "X-Forwarded-Groups"


@dataclass(frozen=True, kw_only=True)
class Identity:
    """A user as the cluster knows them: what a SubjectAccessReview is asked about."""

    username: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: tuple[tuple[str, tuple[str, ...]], ...] = field(default=())

    def as_review_subject(self) -> dict[str, object]:
        """The subject fields of a SubjectAccessReview's spec."""
        subject: dict[str, object] = {"user": self.username, "groups": list(self.groups)}
        if self.uid:
            subject["uid"] = self.uid
        if self.extra:
            subject["extra"] = {key: list(values) for key, values in self.extra}
        return subject


class Unauthenticated(Exception):
    """The request proves no identity the cluster accepts; the message says why, for the login page."""


class TokenReviewer:
    """Asks the API server who a bearer token belongs to (TokenReview), keeping accepted answers `ttl` seconds."""

    def __init__(
        self,
        *,
        kube: KubeClient,
        ttl: float,
        audiences: Sequence[str] = (),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not 0 <= ttl <= MAX_CACHE_SECONDS:
            raise ValueError(f"ttl must be between 0 and {MAX_CACHE_SECONDS:g} seconds, not {ttl!r}")
        self._kube = kube
        self._ttl = ttl
        self._audiences = list(audiences)
        self._clock = clock
        self._known: OrderedDict[str, tuple[float, Identity]] = OrderedDict()
        self.reviews = 0  # TokenReviews sent, for tests and benchmarks

    async def identity(self, token: str) -> Identity:
        """The user `token` authenticates; `Unauthenticated` when the API server does not accept it."""
        token = token.strip()
        if not token:
            raise Unauthenticated("no token given")
        key = hashlib.sha256(token.encode()).hexdigest()  # the token itself is never a key kept around
        now = self._clock()
        cached = self._known.get(key)
        if cached is not None and now < cached[0]:
            return cached[1]
        self._known.pop(key, None)
        spec: dict[str, object] = {"token": token}
        if self._audiences:
            spec["audiences"] = self._audiences
        self.reviews += 1
        try:
            answer = await self._kube.create(
                TOKEN_REVIEWS, body={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": spec}
            )
        except ApiError as exc:
            raise Unauthenticated(f"the API server could not review the token ({exc.status}): try again") from exc
        status = answer.get("status") or {}
        if not status.get("authenticated"):
            raise Unauthenticated(status.get("error") or "the API server does not accept this token")
        identity = _identity_from_user(status.get("user") or {})
        if self._ttl > 0:
            self._known[key] = (now + self._ttl, identity)
            while len(self._known) > MAX_CACHED_TOKENS:
                self._known.popitem(last=False)
        return identity


def _identity_from_user(user: Mapping[str, object]) -> Identity:
    username = str(user.get("username") or "")
    if not username:
        raise Unauthenticated("the API server accepted the token but named no user")
    extra = user.get("extra") or {}
    return Identity(
        username=username,
        uid=str(user.get("uid") or ""),
        groups=tuple(str(group) for group in (user.get("groups") or [])),  # type: ignore[union-attr]
        extra=tuple(sorted((str(k), tuple(map(str, v))) for k, v in extra.items())),  # type: ignore[union-attr]
    )


class ProxyHeaders:
    """The identity an authenticating proxy in front of the console vouches for, trusted only from its addresses.

    A request that carries the headers from any other peer is refused outright (`Unauthenticated`), so a
    misrouted or hostile client learns at once that it cannot name itself.
    """

    def __init__(self, *, trusted: Sequence[str]) -> None:
        if not trusted:
            raise ValueError("name the proxy's addresses (e.g. 127.0.0.1/32 for a sidecar) to trust its headers")
        self._trusted = [ipaddress.ip_network(cidr, strict=False) for cidr in trusted]

    def identity(self, *, peer: str | None, headers: Mapping[str, str]) -> Identity | None:
        """The proxy's user, None when the request has no proxy headers; `Unauthenticated` from another peer."""
        username = (headers.get(PROXY_USER_HEADER) or "").strip()
        if not username:
            return None
        if not self.trusts(peer):
            raise Unauthenticated(
                f"{PROXY_USER_HEADER} came from {peer or 'an unknown address'}, which is not the authenticating "
                "proxy: send requests through the proxy (or add its address to console.authProxy.trustedCIDRs)"
            )
        groups = tuple(g.strip() for g in (headers.get(PROXY_GROUPS_HEADER) or "").split(",") if g.strip())
        return Identity(username=username, groups=(*groups, "system:authenticated"))

    def trusts(self, peer: str | None) -> bool:
        if not peer:
            return False
        try:
            address = ipaddress.ip_address(peer)
        except ValueError:
            return False
        return any(address in network for network in self._trusted)
