"""Injected faults answer only what a real API server could answer."""

import kmock
import pytest

from tests.kubeapi import KubeApiEmulator
from tests.kubeapi.emulator import EmulatorMisuse
from tests.kubeapi.http import CM, JSON_PATCH, MERGE, call


async def test_an_injected_409_is_already_exists_on_create_and_conflict_on_a_conditional_write(kube_api):
    kube_api.fail(method="POST", path_suffix="/configmaps", code=409)
    status, body = await call(kube_api, "POST", CM, {"metadata": {"name": "a"}})
    assert (status, body["reason"]) == (409, "AlreadyExists")
    _, created = await call(kube_api, "POST", CM, {"metadata": {"name": "a"}})
    version = created["metadata"]["resourceVersion"]
    kube_api.fail(method="PATCH", path_suffix="/configmaps/a", code=409, times=2)
    status, body = await call(kube_api, "PATCH", f"{CM}/a", {"metadata": {"resourceVersion": version}},
                              content_type=MERGE)
    assert (status, body["reason"]) == (409, "Conflict")
    test_op = [{"op": "test", "path": "/metadata/resourceVersion", "value": version}]
    status, body = await call(kube_api, "PATCH", f"{CM}/a", test_op, content_type=JSON_PATCH)
    assert (status, body["reason"]) == (409, "Conflict")


async def test_an_injected_409_on_an_unconditional_write_fails_the_test():
    emulator = KubeApiEmulator()
    with pytest.raises(EmulatorMisuse, match="PATCH /configmaps/a, which has no resourceVersion precondition"):
        async with emulator, kmock.Server(emulator):
            await call(emulator, "POST", CM, {"metadata": {"name": "a"}})
            emulator.fail(method="PATCH", path_suffix="/configmaps/a", code=409)
            status, body = await call(emulator, "PATCH", f"{CM}/a", {"data": {"k": "v"}}, content_type=MERGE)
            assert status == 500 and "inject 500, 503 or 429 instead" in body["message"]
