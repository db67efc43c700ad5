"""The emulator's object contract: create, read, list, selectors, patch, replace, status subresource."""

from tests.kubeapi.http import CM, JSON_PATCH, MERGE, call

DEPLOYMENTS = "/apis/apps/v1/namespaces/default/deployments"
PODS = "/api/v1/namespaces/default/pods"


def deployment(name: str, *, image: str = "example/app:1") -> dict:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}},
                         "spec": {"containers": [{"name": "main", "image": image}]}},
        },
    }


async def test_default_namespaces_exist(kube_api):
    status, body = await call(kube_api, "GET", "/api/v1/namespaces")
    assert status == 200
    assert body["kind"] == "NamespaceList"
    assert {"default", "kube-system"} <= {ns["metadata"]["name"] for ns in body["items"]}


async def test_create_answers_201_with_server_set_metadata(kube_api):
    status, created = await call(kube_api, "POST", CM, {"metadata": {"name": "a"}})
    assert status == 201
    meta = created["metadata"]
    assert meta["uid"] and meta["creationTimestamp"].endswith("Z")
    assert int(meta["resourceVersion"]) > 0
    assert "generation" not in meta  # ConfigMaps have none on a real server
    _, second = await call(kube_api, "POST", CM, {"metadata": {"name": "b"}})
    assert int(second["metadata"]["resourceVersion"]) > int(meta["resourceVersion"])


async def test_generate_name_makes_a_unique_name(kube_api):
    _, one = await call(kube_api, "POST", CM, {"metadata": {"generateName": "x-"}})
    _, two = await call(kube_api, "POST", CM, {"metadata": {"generateName": "x-"}})
    assert one["metadata"]["name"].startswith("x-") and len(one["metadata"]["name"]) == 7
    assert one["metadata"]["name"] != two["metadata"]["name"]


async def test_conflicts_and_missing_namespaces(kube_api):
    await call(kube_api, "POST", CM, {"metadata": {"name": "dup"}})
    status, body = await call(kube_api, "POST", CM, {"metadata": {"name": "dup"}})
    assert (status, body["reason"]) == (409, "AlreadyExists")
    assert body["message"] == 'configmaps "dup" already exists'
    status, body = await call(kube_api, "POST", "/api/v1/namespaces/nope/configmaps", {"metadata": {"name": "x"}})
    assert (status, body["message"]) == (404, 'namespaces "nope" not found')
    status, body = await call(kube_api, "POST", CM, {"metadata": {}})
    assert status == 422 and "metadata.name: Required value" in body["message"]


async def test_generation_moves_with_the_spec_only(kube_api):
    _, created = await call(kube_api, "POST", DEPLOYMENTS, deployment("web"))
    assert created["metadata"]["generation"] == 1
    _, labelled = await call(kube_api, "PATCH", f"{DEPLOYMENTS}/web", {"metadata": {"labels": {"a": "b"}}},
                             content_type=MERGE)
    assert labelled["metadata"]["generation"] == 1
    _, scaled = await call(kube_api, "PATCH", f"{DEPLOYMENTS}/web", {"spec": {"replicas": 3}}, content_type=MERGE)
    assert scaled["metadata"]["generation"] == 2
    _, status_written = await call(kube_api, "PATCH", f"{DEPLOYMENTS}/web/status",
                                   {"status": {"replicas": 3}}, content_type=MERGE)
    assert status_written["metadata"]["generation"] == 2


async def test_server_defaults_fill_deployments_and_pods(kube_api):
    _, created = await call(kube_api, "POST", DEPLOYMENTS, deployment("d"))
    spec = created["spec"]
    assert spec["replicas"] == 1 and spec["strategy"]["type"] == "RollingUpdate"
    container = spec["template"]["spec"]["containers"][0]
    assert container["imagePullPolicy"] == "IfNotPresent"
    assert spec["template"]["spec"]["restartPolicy"] == "Always"
    status, body = await call(kube_api, "POST", DEPLOYMENTS, deployment("bad") | {"spec": {"selector": {}}})
    assert status == 422 and "spec.selector: Required value" in body["message"]


async def test_a_write_that_changes_nothing_keeps_the_resource_version(kube_api):
    _, created = await call(kube_api, "POST", CM, {"metadata": {"name": "same"}, "data": {"a": "1"}})
    _, patched = await call(kube_api, "PATCH", f"{CM}/same", {"data": {"a": "1"}}, content_type=MERGE)
    assert patched["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]


async def test_list_with_label_selectors(kube_api):
    for name, labels in [("a", {"tier": "web", "env": "prod"}), ("b", {"tier": "db"}), ("c", {})]:
        await call(kube_api, "POST", CM, {"metadata": {"name": name, "labels": labels}})
    cases = {
        "tier=web": ["a"], "tier==web": ["a"], "tier!=web": ["b", "c"], "tier in (web,db)": ["a", "b"],
        "tier notin (web)": ["b", "c"], "tier": ["a", "b"], "!tier": ["c"], "tier,env=prod": ["a"],
    }
    for selector, expected in cases.items():
        status, body = await call(kube_api, "GET", f"{CM}?labelSelector={selector}")
        assert status == 200, body
        assert [item["metadata"]["name"] for item in body["items"]] == expected, selector
    status, body = await call(kube_api, "GET", f"{CM}?labelSelector=a b c")
    assert status == 400


async def test_list_with_field_selectors_and_pages(kube_api):
    for name in ("p1", "p2", "p3"):
        await call(kube_api, "POST", PODS, {"metadata": {"name": name},
                                            "spec": {"containers": [{"name": "c", "image": "busybox:1"}]}})
    await call(kube_api, "PATCH", f"{PODS}/p2/status", {"status": {"phase": "Running"}}, content_type=MERGE)
    _, running = await call(kube_api, "GET", f"{PODS}?fieldSelector=status.phase=Running")
    assert [p["metadata"]["name"] for p in running["items"]] == ["p2"]
    _, named = await call(kube_api, "GET", f"{PODS}?fieldSelector=metadata.name!=p1")
    assert [p["metadata"]["name"] for p in named["items"]] == ["p2", "p3"]
    status, _ = await call(kube_api, "GET", f"{PODS}?fieldSelector=spec.hostname=x")
    assert status == 400
    _, page = await call(kube_api, "GET", f"{PODS}?limit=2")
    assert len(page["items"]) == 2 and page["metadata"]["continue"]
    _, rest = await call(kube_api, "GET", f"{PODS}?limit=2&continue={page['metadata']['continue']}")
    assert [p["metadata"]["name"] for p in rest["items"]] == ["p3"] and "continue" not in rest["metadata"]


async def test_json_patch_test_failure_and_bad_path_are_422(kube_api):
    await call(kube_api, "POST", CM, {"metadata": {"name": "j"}, "data": {"a": "1"}})
    failed_test = [{"op": "test", "path": "/data/a", "value": "2"}]
    status, body = await call(kube_api, "PATCH", f"{CM}/j", failed_test, content_type=JSON_PATCH)
    assert (status, body["code"]) == (422, 422)
    status, _ = await call(kube_api, "PATCH", f"{CM}/j", [{"op": "remove", "path": "/data/zzz"}],
                          content_type=JSON_PATCH)
    assert status == 422


async def test_strategic_merge_and_apply_patches_are_refused_clearly(kube_api):
    await call(kube_api, "POST", CM, {"metadata": {"name": "s"}})
    for content_type in ("application/strategic-merge-patch+json", "application/apply-patch+yaml"):
        status, body = await call(kube_api, "PATCH", f"{CM}/s", {"data": {}}, content_type=content_type)
        assert status == 415
        assert "merge-patch+json" in body["message"]


async def test_put_needs_the_current_resource_version(kube_api):
    _, created = await call(kube_api, "POST", CM, {"metadata": {"name": "r"}})
    without = {"metadata": {"name": "r"}, "data": {"a": "1"}}
    status, body = await call(kube_api, "PUT", f"{CM}/r", without)
    assert status == 422 and "metadata.resourceVersion" in body["message"]
    current = created | {"data": {"a": "1"}}
    status, replaced = await call(kube_api, "PUT", f"{CM}/r", current)
    assert status == 200 and replaced["metadata"]["uid"] == created["metadata"]["uid"]
    status, body = await call(kube_api, "PUT", f"{CM}/r", current)  # now stale
    assert (status, body["reason"]) == (409, "Conflict")
    assert "the object has been modified" in body["message"]
    stale_patch = {"metadata": {"resourceVersion": created["metadata"]["resourceVersion"]}, "data": {"b": "2"}}
    status, body = await call(kube_api, "PATCH", f"{CM}/r", stale_patch, content_type=MERGE)
    assert (status, body["reason"]) == (409, "Conflict")


async def test_immutable_metadata_is_kept_or_refused(kube_api):
    _, created = await call(kube_api, "POST", CM, {"metadata": {"name": "i"}})
    _, patched = await call(kube_api, "PATCH", f"{CM}/i", {"metadata": {"creationTimestamp": "2000-01-01T00:00:00Z"}},
                            content_type=MERGE)
    assert patched["metadata"]["creationTimestamp"] == created["metadata"]["creationTimestamp"]
    status, _ = await call(kube_api, "PATCH", f"{CM}/i", {"metadata": {"uid": "other"}}, content_type=MERGE)
    assert status == 422
    status, _ = await call(kube_api, "PATCH", f"{CM}/i", {"metadata": {"name": "other"}}, content_type=MERGE)
    assert status == 400


async def test_status_is_a_separate_subresource(kube_api):
    pod = {"metadata": {"name": "s"}, "spec": {"containers": [{"name": "c", "image": "busybox:1"}]},
           "status": {"phase": "Running"}}
    _, created = await call(kube_api, "POST", PODS, pod)
    assert created["status"]["phase"] == "Pending"  # create ignores .status
    _, main = await call(kube_api, "PATCH", f"{PODS}/s", {"metadata": {"labels": {"a": "b"}},
                                                          "status": {"phase": "Failed"}}, content_type=MERGE)
    assert main["status"]["phase"] == "Pending" and main["metadata"]["labels"] == {"a": "b"}
    _, status_only = await call(kube_api, "PATCH", f"{PODS}/s/status", {"metadata": {"labels": {"c": "d"}},
                                                                       "status": {"phase": "Succeeded"}},
                                content_type=MERGE)
    assert status_only["status"]["phase"] == "Succeeded" and status_only["metadata"]["labels"] == {"a": "b"}


async def test_pod_logs_come_from_the_kubelet_stand_in(kube_api):
    pod = {"metadata": {"name": "two"}, "spec": {"containers": [{"name": "a", "image": "x:1"},
                                                                 {"name": "b", "image": "x:1"}]}}
    await call(kube_api, "POST", PODS, pod)
    kube_api.set_pod_log(namespace="default", name="two", container="b", text="1\n2\n3\n")
    status, body = await call(kube_api, "GET", f"{PODS}/two/log")
    assert status == 400 and "a container name must be specified" in body["message"]
    status, text = await call(kube_api, "GET", f"{PODS}/two/log?container=b&tailLines=2")
    assert (status, text) == (200, "2\n3\n")


async def test_secret_string_data_is_folded_into_data(kube_api):
    status, secret = await call(kube_api, "POST", "/api/v1/namespaces/default/secrets",
                                {"metadata": {"name": "s"}, "stringData": {"key": "value"}})
    assert status == 201
    assert secret["data"] == {"key": "dmFsdWU="} and "stringData" not in secret and secret["type"] == "Opaque"


async def test_service_names_are_dns_1035_labels(kube_api):
    service = {"metadata": {"name": "1st"}, "spec": {"ports": [{"port": 80}]}}
    status, body = await call(kube_api, "POST", "/api/v1/namespaces/default/services", service)
    assert status == 422 and "DNS-1035 label" in body["message"] and "start with an alphabetic" in body["message"]
    status, _ = await call(kube_api, "POST", CM, {"metadata": {"name": "1st"}})  # other names may start with one
    assert status == 201
