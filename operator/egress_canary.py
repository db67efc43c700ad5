"""The isolation canary of agent pods: does a pod like an Agent's reach what its egress policy forbids?

An Agent's pods may reach DNS, the bus and the model endpoint; the chart's NetworkPolicy says so, and
a cluster that does not enforce policies ignores it. So the operator runs, per namespace and *policy
shape* (the set of egress NetworkPolicies that select an Agent's pod labels, at their
resourceVersions), one canary pod: the labels of one Agent of that shape, a restricted pod like an
agent's, whose program (`rockbot.reach_probe`) tries ROCKBOT_EGRESS_CANARY_TARGETS and writes what it
reached as its termination message (so the operator needs no right to read logs). Every Agent of that
shape gets `EgressRestricted` True/False/Unknown from it, with the targets reached in the message.

Cost: one pod per namespace and shape every ROCKBOT_EGRESS_CANARY_INTERVAL_SECONDS (600), run when a
reconcile finds the result missing or stale, at most `CONCURRENT` at once; hundreds of Agents under
the chart's one policy are one canary per namespace. A proof is cached and reused by a new Agent of
a known shape. The pod never becomes Ready (a readiness gate nobody sets), so the Agent's Service
never routes to it, and it lacks the pod-template-hash label, so no ReplicaSet adopts it. Its name
is fixed per shape, so one an operator left behind is replaced, never piled up.

The pod runs as the ServiceAccount `rockbot-egress-canary` the operator makes once per namespace: no
token (automountServiceAccountToken false, on the account and on the pod) and no binding, so it holds
no right even if someone binds the namespace's `default` account to one. Its image is the operator's
agent image (ROCKBOT_AGENT_IMAGE), as an agent's pod has.

`EgressMetrics` serves the proofs on the operator's /metrics: `rockbot_isolation_reachable{scope="agents",
namespace,target}` (1 if a canary of any policy shape of the namespace reached it) and
`rockbot_isolation_last_proof_timestamp_seconds{scope="agents",namespace}` (the oldest of the shapes' last
proofs that reached nothing; 0 while one shape has none), from the Agents there now.

Rights, in each Agent namespace (chart: `agents.egressCanary.enabled`, on by default): pods create,
watch, delete; networkpolicies list; serviceaccounts create (which Agents need anyway). Nothing else:
no get, no list of pods, no logs, no exec.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from rockbot.conditions import ConditionUpdate
from rockbot.kube import NETWORKPOLICIES, PODS, SERVICEACCOUNTS, ApiError, Conflict, Gone, KubeClient, NotFound
from rockbot.kube.security import restricted_container_context, restricted_pod_context
from rockbot.reachability import CONDITION, PROBE, PROBE_TIMEOUT_SECONDS, Proof, Targets, findings, now, uris
from rockbot.tasks import cancel_and_wait

log = logging.getLogger(__name__)

K8sObject = dict[str, Any]
CANARY_LABEL = "rockbot.dev/canary"
#: A readiness gate nobody sets: the canary pod is never Ready, so no Service sends it traffic.
NEVER_READY = "rockbot.dev/never-ready"
CONTAINER = "canary"
#: Canary pods running at once, over every namespace.
CONCURRENT = 2
#: How long a canary pod may take from creation to its answer (scheduling, image, the probe).
POD_SECONDS = 120.0
PODS_REACHED = "agent pods"
RETRY_SECONDS = 60.0
#: The canary pods' ServiceAccount, one per Agent namespace: no token, no rights.
SERVICE_ACCOUNT = "rockbot-egress-canary"
Shape = tuple[tuple[str, str], ...]


def selects(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """Whether a LabelSelector (matchLabels, matchExpressions) selects `labels`; an empty one selects all."""
    selector = selector or {}
    if any(labels.get(key) != value for key, value in (selector.get("matchLabels") or {}).items()):
        return False
    for expression in selector.get("matchExpressions") or []:
        key, operator, values = expression.get("key"), expression.get("operator"), expression.get("values") or []
        present = key in labels
        if (operator == "In" and labels.get(key) not in values) or (operator == "NotIn" and labels.get(key) in values) \
                or (operator == "Exists" and not present) or (operator == "DoesNotExist" and present):
            return False
    return True


def shape_of(labels: Mapping[str, str], policies: list[K8sObject]) -> Shape:
    """The egress policies that apply to a pod of `labels`, by name and resourceVersion."""
    return tuple(sorted(
        (policy["metadata"]["name"], policy["metadata"].get("resourceVersion", ""))
        for policy in policies
        if "Egress" in ((policy.get("spec") or {}).get("policyTypes") or ["Ingress"])
        and selects((policy.get("spec") or {}).get("podSelector"), labels)
    ))  # fmt: skip


def canary_pod(*, namespace: str, shape: Shape, labels: Mapping[str, str], image: str, targets: Targets) -> K8sObject:
    """A restricted pod with an agent's labels, running the probe once and saying what it reached."""
    digest = hashlib.sha256(json.dumps([namespace, shape]).encode()).hexdigest()[:10]
    resources = {"cpu": "100m", "memory": "64Mi", "ephemeral-storage": "16Mi"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"rockbot-egress-canary-{digest}", "namespace": namespace,
                     "labels": {**labels, CANARY_LABEL: "egress"}},
        "spec": {
            "restartPolicy": "Never",
            "activeDeadlineSeconds": int(POD_SECONDS),
            "terminationGracePeriodSeconds": 1,
            "serviceAccountName": SERVICE_ACCOUNT,
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "readinessGates": [{"conditionType": NEVER_READY}],
            "securityContext": restricted_pod_context(uid=65532),
            "containers": [{
                "name": CONTAINER,
                "image": image,
                "command": ["python3", "-I", "-c", PROBE, json.dumps(uris(targets)), str(PROBE_TIMEOUT_SECONDS)],
                "resources": {"requests": resources, "limits": resources},
                "securityContext": restricted_container_context(),
                "terminationMessagePolicy": "File",
            }],
        },
    }  # fmt: skip


def service_account(namespace: str, owner: K8sObject) -> K8sObject:
    """The canary pods' account: no token mounted, bound to nothing; owned (not controlled) by the Agent it was made
    for, so it goes with its Agents (helm uninstall leaves nothing) and the next canary makes it again."""
    return {"apiVersion": "v1", "kind": "ServiceAccount", "automountServiceAccountToken": False,
            "metadata": {"name": SERVICE_ACCOUNT, "namespace": namespace, "labels": {CANARY_LABEL: "egress"},
                         "ownerReferences": [{**owner, "controller": False, "blockOwnerDeletion": False}]}}


@dataclass(frozen=True)
class _Known:
    shape: Shape
    proof: Proof


class EgressCanaries:
    """Proofs of agent pods' egress by namespace and shape; asks `on_proof(namespace, names)` to look at the
    Agents whose proof changed again."""

    def __init__(
        self, *, kube: KubeClient, image: str, targets: Targets, interval_seconds: float,
        on_proof: Callable[[str, list[str]], None],
    ) -> None:  # fmt: skip
        self._kube = kube
        self._image = image
        self._targets = targets
        self._interval = interval_seconds
        self._on_proof = on_proof
        self._policies: dict[str, tuple[float, list[K8sObject]]] = {}
        self._proofs: dict[tuple[str, Shape], Proof] = {}
        self._isolated_at: dict[tuple[str, Shape], float] = {}  # the last proof that reached nothing (Unix time)
        self._known: dict[tuple[str, str], _Known] = {}  # (namespace, agent) -> its shape's proof
        self._running: dict[str, asyncio.Task[None]] = {}
        #: Agents (and their labels) that asked for a proof while their namespace's canary task ran.
        self._waiting: dict[str, dict[str, dict[str, str]]] = {}
        self._slots = asyncio.Semaphore(CONCURRENT)

    def condition(
        self, *, namespace: str, name: str, labels: Mapping[str, str], owner: K8sObject,
        shown: Mapping[str, Any] | None = None,
    ) -> ConditionUpdate:
        """The Agent's EgressRestricted as last proven; a missing or stale proof starts a canary for its namespace.

        Until this operator has a proof, the condition the Agent `shown` keeps (a restart rewrites nothing).
        """
        known = self._known.get((namespace, name))
        fresh = known is not None and self._fresh(known.proof) and self._policies_fresh(namespace)
        if not fresh and namespace not in self._running:
            self._running[namespace] = asyncio.create_task(self._prove(namespace, name, dict(labels), owner),
                                                           name=f"egress canary in {namespace}")
        elif not fresh:
            self._waiting.setdefault(namespace, {})[name] = dict(labels)
        if known is None and shown is not None:
            return ConditionUpdate(type=CONDITION, status=shown["status"], reason=shown["reason"],
                                   message=shown.get("message", ""))
        if known is None:
            return ConditionUpdate(type=CONDITION, status="Unknown", reason="CanaryPending",
                                   message="the egress canary of this Agent's pods has not finished yet")
        return known.proof.condition(pods=PODS_REACHED, stamped=False)

    def forget(self, namespace: str, name: str) -> None:
        self._known.pop((namespace, name), None)
        self._waiting.get(namespace, {}).pop(name, None)

    async def stop(self) -> None:
        await cancel_and_wait(*self._running.values())

    def _fresh(self, proof: Proof) -> bool:
        """A proof holds for the interval; a canary that could not run is tried again within a minute."""
        holds = self._interval if proof.error is None else min(self._interval, RETRY_SECONDS)
        return (now() - proof.at).total_seconds() < holds

    def _policies_fresh(self, namespace: str) -> bool:
        listed = self._policies.get(namespace)
        return listed is not None and asyncio.get_running_loop().time() - listed[0] < self._interval

    async def _prove(self, namespace: str, name: str, labels: dict[str, str], owner: K8sObject) -> None:
        """This Agent's shape, proven (again if stale), then the Agents whose proof that changed looked at again,
        and those that asked meanwhile (given the proof if theirs is the same shape, else to ask again).

        Only those: each new Agent of a namespace whose proof holds asks for it, and looking at every Agent of
        the namespace again each time made bringing up N Agents cost N x N reconciles.
        """
        changed = [name]
        try:
            policies = await self._list_policies(namespace)
            shape = shape_of(labels, policies)
            proof = self._proofs.get((namespace, shape))
            if proof is None or not self._fresh(proof):
                async with self._slots:
                    proof = await self._run(namespace=namespace, shape=shape, labels=labels, owner=owner)
                self._proofs[(namespace, shape)] = proof
                if proof.isolated and not proof.off:
                    self._isolated_at[(namespace, shape)] = proof.at.timestamp()
                log.log(logging.INFO if proof.isolated else logging.WARNING, "egress canary in %s: %s", namespace,
                        proof.condition(pods=PODS_REACHED).message)
            self._known[(namespace, name)] = _Known(shape=shape, proof=proof)
            for (ns, agent), known in list(self._known.items()):  # the others of this shape share the proof
                if ns == namespace and known.shape == shape and known.proof is not proof:
                    self._known[(ns, agent)] = _Known(shape=shape, proof=proof)
                    changed.append(agent)
            for agent, agent_labels in self._waiting.get(namespace, {}).items():
                if shape_of(agent_labels, policies) == shape:
                    self._known[(namespace, agent)] = _Known(shape=shape, proof=proof)
        except (ApiError, OSError, aiohttp.ClientError) as exc:
            self._known[(namespace, name)] = _Known(shape=(), proof=Proof(at=now(), error=str(exc)))
        finally:
            self._running.pop(namespace, None)
            changed += [agent for agent in self._waiting.pop(namespace, {}) if agent not in changed]
        self._on_proof(namespace, changed)

    async def _list_policies(self, namespace: str) -> list[K8sObject]:
        if not self._policies_fresh(namespace):
            listed = await self._kube.list(NETWORKPOLICIES, namespace=namespace)
            self._policies[namespace] = (asyncio.get_running_loop().time(), listed.items)
        return self._policies[namespace][1]

    async def _run(self, *, namespace: str, shape: Shape, labels: dict[str, str], owner: K8sObject) -> Proof:
        pod = canary_pod(namespace=namespace, shape=shape, labels=labels, image=self._image, targets=self._targets)
        name = pod["metadata"]["name"]
        await self._delete(namespace, name)  # one a stopped operator left behind
        with contextlib.suppress(Conflict):  # made before (it goes with the Agent it was made for)
            await self._kube.create(SERVICEACCOUNTS, namespace=namespace, body=service_account(namespace, owner))
        try:
            created = await self._kube.create(PODS, namespace=namespace, body=pod)
            terminated = await self._terminated(namespace, name, created["metadata"]["resourceVersion"])
            if terminated is None:
                return Proof(at=now(), error=f"the canary pod {name} did not finish within {POD_SECONDS:g} s")
            try:
                return Proof(at=now(), findings=findings(terminated.get("message") or "", targets=self._targets))
            except ValueError as exc:
                return Proof(at=now(), error=f"{exc} (pod {name}, exit code {terminated.get('exitCode')})")
        finally:
            await asyncio.shield(self._delete(namespace, name))

    async def _terminated(self, namespace: str, name: str, version: str | None) -> K8sObject | None:
        """The canary container's terminated state, followed by a watch (None: not within POD_SECONDS)."""
        try:
            async with asyncio.timeout(POD_SECONDS):
                while True:
                    try:
                        async for event in self._kube.watch(PODS, namespace=namespace,
                                                            field_selector=f"metadata.name={name}",
                                                            resource_version=version, timeout_seconds=60):
                            version = event.object["metadata"]["resourceVersion"]
                            if (state := _terminated(event.object)) is not None:
                                return state
                            if event.type == "DELETED":
                                return None
                    except Gone:  # watch again from the pod as it is now (its first event)
                        version = None
        except TimeoutError:
            return None

    async def _delete(self, namespace: str, name: str) -> None:
        try:
            await self._kube.delete(PODS, namespace=namespace, name=name, grace_period_seconds=0)
        except NotFound:
            pass
        except (ApiError, OSError) as exc:
            log.warning("could not delete the egress canary pod %s/%s: %s", namespace, name, exc)


    def by_namespace(self) -> dict[str, list[tuple[Proof, float]]]:
        """The proofs the Agents hold now, by namespace: each shape's last proof and when it last reached nothing."""
        found: dict[str, dict[Shape, tuple[Proof, float]]] = {}
        for (namespace, _), known in list(self._known.items()):
            isolated_at = self._isolated_at.get((namespace, known.shape), 0.0)
            found.setdefault(namespace, {})[known.shape] = (known.proof, isolated_at)
        return {namespace: list(shapes.values()) for namespace, shapes in found.items()}


class EgressMetrics(Collector):
    """The agents' isolation gauges, computed at each scrape from the proofs Agents hold (no stale series)."""

    def __init__(self, canaries: EgressCanaries) -> None:
        self._canaries = canaries

    def collect(self) -> Iterator[GaugeMetricFamily]:
        reachable = GaugeMetricFamily("rockbot_isolation_reachable", "Whether the last isolation canary reached "
                                      "a target (1) or not (0).", labels=["scope", "namespace", "target"])
        last = GaugeMetricFamily("rockbot_isolation_last_proof_timestamp_seconds", "When an isolation canary last "
                                 "ran and reached nothing (Unix time; 0: never).", labels=["scope", "namespace"])
        for namespace, proofs in sorted(self._canaries.by_namespace().items()):
            targets: dict[str, int] = {}
            for proof, _ in proofs:
                for finding in proof.findings:
                    targets[finding.target] = max(targets.get(finding.target, 0), int(finding.reached))
            for target, value in sorted(targets.items()):
                reachable.add_metric(["agents", namespace, target], value)
            last.add_metric(["agents", namespace], min(isolated_at for _, isolated_at in proofs))
        yield reachable
        yield last


def _terminated(pod: K8sObject) -> K8sObject | None:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == CONTAINER and (state := (status.get("state") or {}).get("terminated")):
            return state
    return None
