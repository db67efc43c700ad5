"""A script pod that could not start is a Warning Event a person can search for by its reason."""

from __future__ import annotations

import pytest

from rockbot.kube import EVENTS, KubeClient
from rockbot.scripts_manager.backends import SandboxFailure
from rockbot.scripts_manager.backends.pods import CANNOT_START, PodBackend
from tests.kubeapi import KubeApiEmulator
from tests.scripts_manager.conftest import NS, node
from tests.scripts_manager.test_pods import backend, image_pull_fails, job  # noqa: F401 (the backend fixture)


async def test_a_pod_whose_image_cannot_be_pulled_is_a_warning_event_in_the_scripts_namespace(
    backend: PodBackend, kube: KubeClient, kube_api: KubeApiEmulator  # noqa: F811
) -> None:
    async with node(kube_api, kube, image_pull_fails) as kubelet:
        with pytest.raises(SandboxFailure, match="ImagePullBackOff"):
            await backend.run(job("print(1)"))
    (pod,) = kubelet.seen
    (event,) = (await kube.list(EVENTS, namespace=NS)).items
    assert (event["type"], event["reason"]) == ("Warning", CANNOT_START) == ("Warning", "ScriptPodFailedToStart")
    assert event["involvedObject"] == {"apiVersion": "v1", "kind": "Pod", "name": pod["metadata"]["name"],
                                       "namespace": NS, "uid": pod["metadata"]["uid"]}
    assert "could not start" in event["message"] and "ImagePullBackOff" in event["message"]
    assert event["source"]["component"] == "rockbot-scripts-manager"


async def test_a_script_that_runs_posts_no_event(
    backend: PodBackend, kube: KubeClient, kube_api: KubeApiEmulator  # noqa: F811
) -> None:
    async with node(kube_api, kube):
        assert (await backend.run(job("print(1)"))).exit_code == 0
    assert (await kube.list(EVENTS, namespace=NS)).items == []
