"""Watch streams: resume, 410, timeouts, selectors, and no lost events between list and watch."""

import asyncio
import json

import pytest

from tests.kubeapi.http import CM, MERGE, call, names, watch


@pytest.mark.parametrize("flag", ["true", "True", "1"])
async def test_watch_flag_spellings_and_initial_added_events(kube_api, flag):
    await call(kube_api, "POST", CM, {"metadata": {"name": "a"}})
    events = await watch(kube_api, f"{CM}?watch={flag}&timeoutSeconds=1")
    assert names(events) == [("ADDED", "a")]


async def test_resume_replays_changes_after_the_resource_version(kube_api):
    _, first = await call(kube_api, "POST", CM, {"metadata": {"name": "a"}})
    await call(kube_api, "POST", CM, {"metadata": {"name": "b"}})
    await call(kube_api, "PATCH", f"{CM}/a", {"data": {"x": "y"}}, content_type=MERGE)
    await call(kube_api, "DELETE", f"{CM}/b")
    rv = first["metadata"]["resourceVersion"]
    events = await watch(kube_api, f"{CM}?watch=true&resourceVersion={rv}&timeoutSeconds=1")
    assert names(events) == [("ADDED", "b"), ("MODIFIED", "a"), ("DELETED", "b")]


async def test_a_compacted_resource_version_gets_a_410_error_event(kube_api):
    _, first = await call(kube_api, "POST", CM, {"metadata": {"name": "a"}})
    await call(kube_api, "POST", CM, {"metadata": {"name": "b"}})
    kube_api.compact()  # the change to "b" is no longer in the history
    rv = first["metadata"]["resourceVersion"]
    events = await watch(kube_api, f"{CM}?watch=true&resourceVersion={rv}&timeoutSeconds=1")
    assert [(type_, obj["code"], obj["reason"]) for type_, obj in events] == [("ERROR", 410, "Expired")]


async def test_watch_of_one_name_by_field_selector(kube_api):
    await call(kube_api, "POST", CM, {"metadata": {"name": "a"}})
    await call(kube_api, "POST", CM, {"metadata": {"name": "b"}})
    events = await watch(kube_api, f"{CM}?watch=true&fieldSelector=metadata.name%3Db&timeoutSeconds=1")
    assert names(events) == [("ADDED", "b")]


async def test_objects_leaving_a_label_selection_are_sent_as_deleted(kube_api):
    _, created = await call(kube_api, "POST", CM, {"metadata": {"name": "a", "labels": {"app": "x"}}})
    await call(kube_api, "PATCH", f"{CM}/a", {"metadata": {"labels": {"app": "y"}}}, content_type=MERGE)
    await call(kube_api, "PATCH", f"{CM}/a", {"metadata": {"labels": {"app": "x"}}}, content_type=MERGE)
    rv = created["metadata"]["resourceVersion"]
    events = await watch(kube_api, f"{CM}?watch=true&labelSelector=app%3Dx&resourceVersion={rv}&timeoutSeconds=1")
    assert names(events) == [("DELETED", "a"), ("ADDED", "a")]


async def test_no_event_is_lost_between_list_and_watch_under_concurrent_writes(kube_api):
    async def writer() -> None:
        for index in range(30):
            await call(kube_api, "POST", CM, {"metadata": {"name": f"w{index}"}})

    task = asyncio.create_task(writer())
    await asyncio.sleep(0.01)
    _, listed = await call(kube_api, "GET", CM)
    seen = {item["metadata"]["name"] for item in listed["items"]}
    rv = listed["metadata"]["resourceVersion"]
    await task
    events = await watch(kube_api, f"{CM}?watch=true&resourceVersion={rv}&timeoutSeconds=1")
    seen |= {obj["metadata"]["name"] for type_, obj in events if type_ == "ADDED"}
    assert seen == {f"w{index}" for index in range(30)}


async def test_live_stream_ends_at_timeout_seconds(kube_api):
    async with kube_api.request("GET", f"{CM}?watch=true&timeoutSeconds=1") as response:
        await call(kube_api, "POST", CM, {"metadata": {"name": "live"}})
        lines = [json.loads(line) async for line in response.content if line.strip()]
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in lines] == [("ADDED", "live")]


async def test_end_watches_closes_open_streams(kube_api):
    async with kube_api.request("GET", f"{CM}?watch=true") as response:
        kube_api.end_watches()
        lines = [line async for line in response.content if line.strip()]
    assert lines == []
