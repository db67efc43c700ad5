"""What a user may do in the console, as the cluster's RBAC says (SubjectAccessReview), per namespace.

Console rights are ordinary RBAC on made-up subresources of `agents` (RBAC evaluates names the API
server does not serve): seeing an Agent and its runs is `get agents`, chatting is `create agents/chat`,
approving a tool call is `create agents/approve`, seeing the long-term memories of a namespace's Agents (every
caller's) is `get agents/memories` and forgetting any of them `delete agents/memories` (a person's own memories
need no right: they are theirs). A platform team grants them with Roles; the console
only asks. Answers (yes and no) are kept a few seconds, never over a minute.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from rockbot.console.authentication import MAX_CACHE_SECONDS, Identity
from rockbot.kube import SUBJECT_ACCESS_REVIEWS, ApiError, KubeClient
from rockbot.kube.resources import GROUP

#: Decisions kept at once; the oldest go first.
MAX_CACHED_DECISIONS = 50_000


@dataclass(frozen=True, kw_only=True)
class Action:
    """One thing a console user does, as the RBAC attributes that govern it."""

    verb: str
    subresource: str = ""
    resource: str = "agents"

    def describe(self) -> str:
        return f"{self.verb} {self.resource}{'/' + self.subresource if self.subresource else ''}"


VIEW = Action(verb="get")
CHAT = Action(verb="create", subresource="chat")
APPROVE = Action(verb="create", subresource="approve")
MEMORIES = Action(verb="get", subresource="memories")
FORGET = Action(verb="delete", subresource="memories")


class Authorizer(Protocol):
    async def allowed(self, *, identity: Identity, namespace: str, action: Action) -> bool: ...


class AccessReviewer:
    """Asks the API server's authorizer (SubjectAccessReview) and keeps each answer `ttl` seconds."""

    def __init__(self, *, kube: KubeClient, ttl: float, clock: Callable[[], float] = time.monotonic) -> None:
        if not 0 <= ttl <= MAX_CACHE_SECONDS:
            raise ValueError(f"ttl must be between 0 and {MAX_CACHE_SECONDS:g} seconds, not {ttl!r}")
        self._kube = kube
        self._ttl = ttl
        self._clock = clock
        self._decisions: OrderedDict[tuple[Identity, str, Action], tuple[float, bool]] = OrderedDict()
        self.reviews = 0  # SubjectAccessReviews sent, for tests and benchmarks

    async def allowed(self, *, identity: Identity, namespace: str, action: Action) -> bool:
        """Whether `identity` may do `action` on Agents of `namespace`; an API error counts as no (fail closed)."""
        key = (identity, namespace, action)
        now = self._clock()
        cached = self._decisions.get(key)
        if cached is not None and now < cached[0]:
            return cached[1]
        self._decisions.pop(key, None)
        attributes = {"namespace": namespace, "verb": action.verb, "group": GROUP, "resource": action.resource}
        if action.subresource:
            attributes["subresource"] = action.subresource
        body = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {**identity.as_review_subject(), "resourceAttributes": attributes},
        }
        self.reviews += 1
        try:
            answer = await self._kube.create(SUBJECT_ACCESS_REVIEWS, body=body)
        except ApiError:
            return False  # not kept: the next request asks again
        status = answer.get("status") or {}
        decision = bool(status.get("allowed")) and not status.get("denied")
        if self._ttl > 0:
            self._decisions[key] = (now + self._ttl, decision)
            while len(self._decisions) > MAX_CACHED_DECISIONS:
                self._decisions.popitem(last=False)
        return decision

