"""`ensure` against the emulated API server: create, compare, and adopt what a racer created first."""

from __future__ import annotations

from typing import Any

from rockbot.kube import AGENTS, SECRETS, SERVICEACCOUNTS, KubeClient
from rockbot.kube.resources import Resource
from rockbot.operator import builders
from rockbot.operator.children import ensure, ensure_created
from rockbot.resources import Agent
from tests.operator.samples import agent_body


async def existing_agent(kube: KubeClient) -> Agent:
    """A stored Agent: children owned by a missing one are garbage-collected, here as on a cluster."""
    body = agent_body()
    del body["metadata"]["uid"], body["metadata"]["generation"]
    return Agent.model_validate(await kube.create(AGENTS, namespace="default", body=body))


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


async def test_a_create_that_loses_the_race_compares_and_patches_the_winner(kube_client: KubeClient):
    the_agent = await existing_agent(kube_client)
    desired = builders.build_service_account(the_agent)
    racer = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "rockbot-analyst"}}
    raced = RacedClient(kube_client, first=racer)
    result = await ensure(raced, SERVICEACCOUNTS, desired)  # type: ignore[arg-type]
    assert raced.creates == 1
    live = await kube_client.get(SERVICEACCOUNTS, namespace="default", name="rockbot-analyst")
    assert live["automountServiceAccountToken"] is False  # the winner, brought in line
    assert live["metadata"]["ownerReferences"][0]["uid"] == the_agent.metadata["uid"]
    assert result["metadata"]["resourceVersion"] == live["metadata"]["resourceVersion"]


async def test_a_generated_secret_is_built_only_when_it_must_be_created(kube_client: KubeClient):
    the_agent = await existing_agent(kube_client)
    builds: list[str] = []

    def build() -> dict[str, Any]:
        builds.append("token")
        return builders.build_http_token_secret(the_agent, f"token-{len(builds)}")

    metadata = builders.http_token_metadata(the_agent)
    first = await ensure_created(kube_client, SECRETS, metadata=metadata, build=build)
    again = await ensure_created(kube_client, SECRETS, metadata=metadata, build=build)
    assert builds == ["token"]  # no token made (and thrown away) once the Secret exists
    assert again["data"] == first["data"]
