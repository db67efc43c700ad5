"""Comparing desired with live objects, and keeping condition transition times honest."""

from __future__ import annotations

import datetime

from rockbot.kube.errors import Invalid
from rockbot.operator.conditions import ConditionUpdate, merge_conditions
from rockbot.operator.diffing import contains
from rockbot.operator.reconciler import MAX_MESSAGE, failure_message

T0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
T1 = T0 + datetime.timedelta(hours=1)


def test_server_defaults_in_live_objects_are_not_differences():
    desired = {"spec": {"template": {"spec": {"containers": [{"name": "agent", "image": "x"}]}}}}
    live = {
        "spec": {
            "revisionHistoryLimit": 10,
            "template": {
                "spec": {
                    "dnsPolicy": "ClusterFirst",
                    "containers": [{"name": "agent", "image": "x", "imagePullPolicy": "Always"}],
                }
            },
        }
    }
    assert contains(live, desired)


def test_a_changed_or_missing_field_is_a_difference():
    assert not contains({"spec": {"replicas": 2}}, {"spec": {"replicas": 1}})
    assert not contains({"spec": {}}, {"spec": {"replicas": 1}})
    assert not contains({"a": [{"x": 1}, {"x": 2}]}, {"a": [{"x": 1}]})


def test_canonicalised_quantities_are_equal_only_under_resources():
    assert contains(
        {"resources": {"limits": {"cpu": "500m", "memory": "1Gi"}}},
        {"resources": {"limits": {"cpu": "0.5", "memory": "1024Mi"}}},
    )
    assert not contains({"resources": {"limits": {"cpu": "1"}}}, {"resources": {"limits": {"cpu": "2"}}})
    assert not contains({"data": {"x": "0.5"}}, {"data": {"x": "500m"}})


def test_transition_time_moves_only_when_the_status_changes():
    first = merge_conditions(
        [], [ConditionUpdate(type="Ready", status="False", reason="Progressing")], generation=1, now=T0
    )
    same = merge_conditions(
        first,
        [ConditionUpdate(type="Ready", status="False", reason="StillProgressing", message="1/2")],
        generation=2,
        now=T1,
    )
    flipped = merge_conditions(
        same, [ConditionUpdate(type="Ready", status="True", reason="DeploymentReady")], generation=2, now=T1
    )
    assert first[0]["lastTransitionTime"] == "2026-01-01T00:00:00Z"
    assert same[0]["lastTransitionTime"] == "2026-01-01T00:00:00Z"
    assert same[0] | {"lastTransitionTime": None} == {
        "type": "Ready",
        "status": "False",
        "reason": "StillProgressing",
        "message": "1/2",
        "lastTransitionTime": None,
        "observedGeneration": 2,
    }
    assert flipped[0]["lastTransitionTime"] == "2026-01-01T01:00:00Z"


def test_a_failure_message_carries_the_servers_answer_and_is_bounded():
    refused = Invalid(status=422, reason="Invalid", message='Deployment.apps "rockbot-a" is invalid: spec.replicas')
    assert failure_message(refused) == (
        "reconcile failed, retrying with backoff: the API server answered 422 Invalid: "
        'Deployment.apps "rockbot-a" is invalid: spec.replicas'
    )
    long = failure_message(RuntimeError("x" * 5000))
    assert long.startswith("reconcile failed, retrying with backoff: RuntimeError: xxx")
    assert len(long) == MAX_MESSAGE and long.endswith("…")
