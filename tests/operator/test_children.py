"""Children on the real API server: created, compared with the watched copy, adopted or refused."""

from __future__ import annotations

from typing import Any

import pytest

from rockbot.kube import AGENTS, CONFIGMAPS, DEPLOYMENTS, SECRETS, SERVICEACCOUNTS, KubeClient
from rockbot.kube.resources import Resource
from rockbot.operator import builders
from rockbot.operator.children import Children, ForeignOwner, ensure, ensure_created
from rockbot.resources import Agent
from tests.operator.samples import agent_body


async def existing_agent(kube: KubeClient, namespace: str) -> Agent:
    """A stored Agent: children owned by a missing one are garbage-collected."""
    body = agent_body(namespace=namespace)
    del body["metadata"]["uid"], body["metadata"]["generation"]
    return Agent.model_validate(await kube.create(AGENTS, namespace=namespace, body=body))


class RacedClient:
    """The operator's client, except that someone else creates the object just before each create of ours.

    The API server then answers our create 409 AlreadyExists, as it does when another reconcile or a
    person wins the race between our GET (404) and our POST.
    """

    def __init__(self, kube: KubeClient, *, first: dict[str, Any]) -> None:
        self._kube = kube
        self._first = first
        self.creates = 0

    async def get(self, resource: Resource, **kwargs: Any) -> dict[str, Any]:
        return await self._kube.get(resource, **kwargs)

    async def create(self, resource: Resource, *, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        self.creates += 1
        await self._kube.create(resource, namespace=namespace, body=self._first)
        return await self._kube.create(resource, namespace=namespace, body=body)

    async def patch(self, resource: Resource, **kwargs: Any) -> dict[str, Any]:
        return await self._kube.patch(resource, **kwargs)


async def test_a_create_that_loses_the_race_compares_and_patches_the_winner(kube: KubeClient, kube_namespace: str):
    the_agent = await existing_agent(kube, kube_namespace)
    desired = builders.build_service_account(the_agent)
    racer = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "rockbot-analyst"}}
    raced = RacedClient(kube, first=racer)
    children = Children()
    result = await ensure(raced, children, SERVICEACCOUNTS, desired)  # type: ignore[arg-type]
    assert raced.creates == 1
    live = await kube.get(SERVICEACCOUNTS, namespace=kube_namespace, name="rockbot-analyst")
    assert live["automountServiceAccountToken"] is False  # the winner, brought in line
    assert live["metadata"]["ownerReferences"][0]["uid"] == the_agent.metadata["uid"]
    assert result.resource_version == live["metadata"]["resourceVersion"]
    assert children.get(SERVICEACCOUNTS, kube_namespace, "rockbot-analyst") == result


async def test_a_generated_secret_is_built_only_when_it_must_be_created(kube: KubeClient, kube_namespace: str):
    the_agent = await existing_agent(kube, kube_namespace)
    builds: list[str] = []

    def build() -> dict[str, Any]:
        builds.append("token")
        return builders.build_http_token_secret(the_agent, f"token-{len(builds)}")

    metadata = builders.http_token_metadata(the_agent)
    first = await ensure_created(kube, SECRETS, metadata=metadata, build=build)
    again = await ensure_created(kube, SECRETS, metadata=metadata, build=build)
    assert builds == ["token"]  # no token made (and thrown away) once the Secret exists
    assert again["data"] == first["data"]


class NoRequests:
    """A client that fails the test on any request."""

    def __getattr__(self, verb: str) -> Any:
        raise AssertionError(f"{verb}: a child that matches its watched copy needs no request")


async def test_a_child_matching_its_watched_copy_costs_no_request(kube: KubeClient, kube_namespace: str):
    the_agent = await existing_agent(kube, kube_namespace)
    desired = builders.build_service_account(the_agent)
    children = Children()
    await ensure(kube, children, SERVICEACCOUNTS, desired)
    live = await kube.get(SERVICEACCOUNTS, namespace=kube_namespace, name="rockbot-analyst")
    assert children.seen(SERVICEACCOUNTS, live) is False  # the echo of our own create: no news
    await ensure(NoRequests(), children, SERVICEACCOUNTS, desired)  # type: ignore[arg-type]


def test_events_older_than_our_write_are_not_taken_until_its_echo_arrives():
    children = Children()
    before = {"kind": "ConfigMap", "metadata": {"name": "c", "namespace": "d", "resourceVersion": "5"},
              "data": {"a": "old"}}
    ours = {**before, "metadata": {**before["metadata"], "resourceVersion": "7"}, "data": {"a": "new"}}
    with children.writing(CONFIGMAPS, "d", "c") as record:
        record(ours)
    assert children.seen(CONFIGMAPS, before) is False  # an older event still on its way
    assert children.get(CONFIGMAPS, "d", "c").body()["data"] == {"a": "new"}
    assert children.seen(CONFIGMAPS, ours) is False  # the echo
    later = {**ours, "metadata": {**ours["metadata"], "resourceVersion": "9"}, "data": {"a": "edited"}}
    assert children.seen(CONFIGMAPS, later) is True  # someone edited it: news
    assert children.get(CONFIGMAPS, "d", "c").body()["data"] == {"a": "edited"}


def test_a_write_whose_echo_came_before_its_answer_keeps_what_the_watch_showed():
    children = Children()
    news: list[tuple[str, bool]] = []
    children.on_news = lambda child, only_status: news.append((child.resource_version, only_status))
    meta = {"name": "d", "namespace": "n", "generation": 1}
    ours = {"kind": "Deployment", "metadata": {**meta, "resourceVersion": "3"}}
    started = {"observedGeneration": 1, "updatedReplicas": 1, "readyReplicas": 1}
    with children.writing(DEPLOYMENTS, "n", "d") as record:
        assert children.seen(DEPLOYMENTS, ours) is False  # the echo of our create, before its answer
        assert children.seen(DEPLOYMENTS, {**ours, "metadata": {**meta, "resourceVersion": "4"},
                                           "status": started}) is False  # and the controller's status
        child = record(ours)
    assert child.rollout is not None and child.rollout.ready == 1  # not the (older) answer
    assert news == [("4", True)]  # the controller's report, seen meanwhile, is news for the Agent's status only
    later = {**ours, "metadata": {**meta, "resourceVersion": "5"}, "status": {**started, "readyReplicas": 0}}
    assert children.seen(DEPLOYMENTS, later) is True  # nothing is waiting for an echo

    news.clear()
    with children.writing(DEPLOYMENTS, "n", "d") as record:  # someone edits the spec while we patch it
        assert children.seen(DEPLOYMENTS, {**later, "metadata": {**meta, "resourceVersion": "7"},
                                           "spec": {"replicas": 3}}) is False
        record({**later, "metadata": {**meta, "resourceVersion": "6"}})
    assert news == [("7", False)]  # news for the whole Agent


def test_a_deployment_status_change_is_news_only_when_the_rollout_moves():
    children = Children()
    meta = {"name": "d", "namespace": "n", "generation": 1}
    children.seen(DEPLOYMENTS, {"kind": "Deployment", "metadata": {**meta, "resourceVersion": "1"}})
    started = {"observedGeneration": 1, "updatedReplicas": 1, "conditions": [{"type": "Progressing"}]}
    assert children.seen(DEPLOYMENTS, {"kind": "Deployment", "metadata": {**meta, "resourceVersion": "2"},
                                       "status": started}) is True
    touched = {**started, "conditions": [{"type": "Progressing", "lastUpdateTime": "later"}]}
    assert children.seen(DEPLOYMENTS, {"kind": "Deployment", "metadata": {**meta, "resourceVersion": "3"},
                                       "status": touched}) is False
    revised = {**meta, "resourceVersion": "4", "annotations": {"deployment.kubernetes.io/revision": "1"}}
    assert children.seen(DEPLOYMENTS, {"kind": "Deployment", "metadata": revised, "status": touched}) is False


async def test_an_adopted_config_map_keeps_none_of_a_strangers_keys(kube: KubeClient, kube_namespace: str):
    the_agent = await existing_agent(kube, kube_namespace)
    stranger = {"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "rockbot-analyst-config", "labels": {"team": "x"}},
                "data": {builders.CONFIG_KEY: "{}", "extra.json": '{"evil": true}'}}
    await kube.create(CONFIGMAPS, namespace=kube_namespace, body=stranger)
    await ensure(kube, Children(), CONFIGMAPS, builders.build_config_map(the_agent, '{"ours": 1}'))
    live = await kube.get(CONFIGMAPS, namespace=kube_namespace, name="rockbot-analyst-config")
    assert live["data"] == {builders.CONFIG_KEY: '{"ours": 1}'}  # nothing of the stranger's can be mounted
    assert live["metadata"]["ownerReferences"][0]["uid"] == the_agent.metadata["uid"]
    assert live["metadata"]["labels"]["team"] == "x"  # its own metadata is left alone


async def test_a_token_secret_the_agent_does_not_control_is_refused_not_used(kube: KubeClient, kube_namespace: str):
    the_agent = await existing_agent(kube, kube_namespace)
    planted = builders.build_http_token_secret(the_agent, "known-to-someone")
    del planted["metadata"]["ownerReferences"]
    await kube.create(SECRETS, namespace=kube_namespace, body=planted)
    metadata = builders.http_token_metadata(the_agent)
    with pytest.raises(ForeignOwner, match="is not controlled by this Agent: delete it so the operator can generate"):
        await ensure_created(kube, SECRETS, metadata=metadata,
                             build=lambda: builders.build_http_token_secret(the_agent, "fresh"))
