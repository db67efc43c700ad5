"""Who a console user is and what they may do, asked of the real API server (TokenReview, SubjectAccessReview)."""

from __future__ import annotations

import pytest

from rockbot.console.authentication import Identity, ProxyHeaders, TokenReviewer, Unauthenticated
from rockbot.console.authorization import APPROVE, CHAT, VIEW, AccessReviewer
from rockbot.kube import KubeClient
from tests.console.conftest import Rbac, service_account_token

VIEW_AND_CHAT = '[{apiGroups: [rockbot.dev], resources: [agents], verbs: [get, list]}, ' \
                '{apiGroups: [rockbot.dev], resources: [agents/chat], verbs: [create]}]'


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_a_service_account_token_is_its_user(kube_admin: KubeClient, namespaces: list[str]) -> None:
    token = await service_account_token(kube_admin, namespace=namespaces[0], name="alice")
    identity = await TokenReviewer(kube=kube_admin, ttl=10).identity(token)
    assert identity.username == f"system:serviceaccount:{namespaces[0]}:alice"
    assert "system:serviceaccounts" in identity.groups
    assert identity.uid


async def test_a_token_the_cluster_does_not_accept_is_refused(kube_admin: KubeClient) -> None:
    reviewer = TokenReviewer(kube=kube_admin, ttl=10)
    with pytest.raises(Unauthenticated):
        await reviewer.identity("not-a-token")
    with pytest.raises(Unauthenticated, match="no token"):
        await reviewer.identity("  ")


async def test_accepted_tokens_are_kept_for_the_ttl_only(kube_admin: KubeClient, namespaces: list[str]) -> None:
    token = await service_account_token(kube_admin, namespace=namespaces[0], name="alice")
    clock = Clock()
    reviewer = TokenReviewer(kube=kube_admin, ttl=5, clock=clock)
    first = await reviewer.identity(token)
    assert await reviewer.identity(token) == first
    assert reviewer.reviews == 1
    clock.now += 5
    await reviewer.identity(token)
    assert reviewer.reviews == 2


def test_no_answer_is_kept_over_a_minute(kube_admin: KubeClient) -> None:
    with pytest.raises(ValueError, match="between 0 and 60"):
        TokenReviewer(kube=kube_admin, ttl=61)
    with pytest.raises(ValueError, match="between 0 and 60"):
        AccessReviewer(kube=kube_admin, ttl=120)


async def test_rights_are_the_clusters_rbac_per_namespace(
    rbac: Rbac, kube_admin: KubeClient, namespaces: list[str]
) -> None:
    mine, other = namespaces
    token = await service_account_token(kube_admin, namespace=mine, name="alice")
    alice = await TokenReviewer(kube=kube_admin, ttl=0).identity(token)
    rbac.grant(namespace=mine, user=alice.username, rules=VIEW_AND_CHAT, name="console-user")
    reviewer = AccessReviewer(kube=kube_admin, ttl=0)
    assert await reviewer.allowed(identity=alice, namespace=mine, action=VIEW)
    assert await reviewer.allowed(identity=alice, namespace=mine, action=CHAT)
    assert not await reviewer.allowed(identity=alice, namespace=mine, action=APPROVE)
    assert not await reviewer.allowed(identity=alice, namespace=other, action=VIEW)


async def test_decisions_are_kept_seconds_then_asked_again(
    rbac: Rbac, kube_admin: KubeClient, namespaces: list[str]
) -> None:
    mine = namespaces[0]
    bob = Identity(username="bob@example.com", groups=("system:authenticated",))
    clock = Clock()
    reviewer = AccessReviewer(kube=kube_admin, ttl=10, clock=clock)
    assert not await reviewer.allowed(identity=bob, namespace=mine, action=VIEW)
    rbac.grant(namespace=mine, user="bob@example.com", rules=VIEW_AND_CHAT, name="late-grant")
    assert not await reviewer.allowed(identity=bob, namespace=mine, action=VIEW)  # still the kept answer
    assert reviewer.reviews == 1
    clock.now += 10
    assert await reviewer.allowed(identity=bob, namespace=mine, action=VIEW)
    assert reviewer.reviews == 2


def test_proxy_headers_count_only_from_the_proxy() -> None:
    proxy = ProxyHeaders(trusted=["127.0.0.1/32", "fd00::/8"])
    headers = {"X-Forwarded-User": "carol@example.com", "X-Forwarded-Groups": "ops, dev"}
    carol = proxy.identity(peer="127.0.0.1", headers=headers)
    assert carol == Identity(username="carol@example.com", groups=("ops", "dev", "system:authenticated"))
    assert proxy.identity(peer="127.0.0.1", headers={}) is None
    with pytest.raises(Unauthenticated, match="not the authenticating proxy"):
        proxy.identity(peer="10.0.0.7", headers=headers)
    with pytest.raises(Unauthenticated):
        proxy.identity(peer=None, headers=headers)
    with pytest.raises(ValueError, match="proxy's addresses"):
        ProxyHeaders(trusted=[])
