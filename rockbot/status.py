"""`rockbot status`: is isolation proven? One line per component, from what the cluster already holds.

    rockbot status                          # the scripts-manager, and the Agents of the context's namespace
    rockbot status -A --context prod        # the Agents of every namespace
    rockbot status --local                  # `rockbot local`'s sandbox, proven now on this machine

The scripts-manager's line is its last isolation canary's proof, read from the Event it posts on the
scripts namespace with every proof (its `rockbot.dev/isolation-proof` annotation, `PublishedProof`).
That is the least-privilege route: the reader needs only `events list` in the scripts namespace (the
built-in `view` role has it), the manager no right it did not have, and nothing is proxied to its pod.
A proof older than two intervals, or none (Events live an hour), is Unknown: no canary is running.
Each Agent's line is its Ready and EgressRestricted conditions, as the operator wrote them (`agents list`).

Exit status: 0 when every line's EgressRestricted is True; 1 when one is not (False, Unknown, stale or
missing: isolation is not proven); 2 when the cluster could not be read.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pydantic import ValidationError

from rockbot.reachability import CONDITION, PROOF_ANNOTATION, PublishedProof

if TYPE_CHECKING:
    from rockbot.kube import K8sObject, KubeClient

#: The scripts namespace of the chart's default values.
SCRIPTS_NAMESPACE = "rockbot-scripts"
#: A proof may be this much later than its interval (the canary's own run) before it counts as stale.
LATE_SECONDS = 60.0
#: Conditions of an Agent shown, in this order.
AGENT_CONDITIONS = ("Ready", CONDITION)


@dataclass(frozen=True)
class Condition:
    type: str
    status: str
    reason: str
    message: str = ""

    def text(self) -> str:
        """`Type=Status (Reason)`, with the message when it says something to act on (always for isolation)."""
        shown = self.message and (self.status != "True" or self.type == CONDITION)
        return f"{self.type}={self.status} ({self.reason})" + (f": {self.message}" if shown else "")


@dataclass(frozen=True)
class Line:
    """One component's conditions; its isolation is proven when its EgressRestricted is True."""

    component: str
    conditions: tuple[Condition, ...]

    @property
    def proven(self) -> bool:
        return any(c.type == CONDITION and c.status == "True" for c in self.conditions)

    def text(self) -> str:
        return f"{self.component}: " + "; ".join(c.text() for c in self.conditions)


def scripts_line(events: list[K8sObject], *, namespace: str, now: datetime.datetime) -> Line:
    """The scripts-manager's line from the Events of its scripts namespace: the newest published proof."""
    proofs = []
    for event in events:
        published = ((event.get("metadata") or {}).get("annotations") or {}).get(PROOF_ANNOTATION)
        if published is None:
            continue
        try:
            proofs.append(PublishedProof.model_validate_json(published))
        except ValidationError:
            continue  # not a proof this version understands; an older or newer one may be
    component = f"scripts-manager (scripts namespace {namespace})"
    if not proofs:
        return Line(component, (Condition(
            CONDITION, "Unknown", "NoProof",
            f"no isolation canary proof in {namespace} (Events live an hour): is the scripts-manager running, "
            "and is this the chart's scripts namespace (--scripts-namespace)?"),))  # fmt: skip
    proof = max(proofs, key=lambda p: p.at)
    at = proof.at.strftime("%Y-%m-%dT%H:%M:%SZ")
    late = (now - proof.at).total_seconds() - 2 * proof.interval_seconds - LATE_SECONDS
    if late > 0:
        return Line(component, (Condition(
            CONDITION, "Unknown", "ProofStale",
            f"the last proof ({proof.status}, {at}) is older than two canary intervals of "
            f"{proof.interval_seconds:g} s: is the scripts-manager running?"),))  # fmt: skip
    enforced = "scripts refused until proven" if proof.enforce else "scripts run anyway: enforce is false"
    message = proof.message if proof.status == "True" else f"{proof.message} ({enforced})"
    return Line(component, (Condition(CONDITION, proof.status, proof.reason, message),))


def agent_lines(agents: list[K8sObject]) -> list[Line]:
    """Each Agent's Ready and EgressRestricted, as its status says (Unknown when it says nothing yet)."""
    lines = []
    for agent in sorted(agents, key=lambda a: (a["metadata"]["namespace"], a["metadata"]["name"])):
        found = {c.get("type"): c for c in (agent.get("status") or {}).get("conditions") or []}
        conditions = []
        for type_ in AGENT_CONDITIONS:
            c = found.get(type_)
            conditions.append(
                Condition(type_, "Unknown", "NotReported", "the operator has not reported it") if c is None
                else Condition(type_, c.get("status", "Unknown"), c.get("reason", ""), c.get("message", ""))
            )  # fmt: skip
        lines.append(Line(f"agent {agent['metadata']['namespace']}/{agent['metadata']['name']}", tuple(conditions)))
    return lines


async def cluster_lines(
    kube: KubeClient, *, namespace: str | None, scripts_namespace: str, now: datetime.datetime | None = None
) -> list[Line]:
    """The scripts-manager's line, then one per Agent of `namespace` (None: every namespace)."""
    from rockbot.kube import AGENTS, EVENTS

    now = now or datetime.datetime.now(datetime.UTC)
    selector = f"involvedObject.kind=Namespace,involvedObject.name={scripts_namespace}"
    events, agents = await asyncio.gather(kube.list(EVENTS, namespace=scripts_namespace, field_selector=selector),
                                          kube.list(AGENTS, namespace=namespace))
    return [scripts_line(events.items, namespace=scripts_namespace, now=now), *agent_lines(agents.items)]


async def local_line() -> Line:
    """`rockbot local`'s sandbox, proven now: its canary, as `rockbot local` runs it at start-up."""
    from rockbot.scripts_manager.app import create_backend
    from rockbot.scripts_manager.backends import SandboxFailure, SandboxUnavailable
    from rockbot.scripts_manager.metrics import ScriptMetrics
    from rockbot.scripts_manager.settings import ScriptsManagerSettings

    component = "sandbox (rockbot local)"
    settings = ScriptsManagerSettings(scripts_backend="local")
    try:
        backend, canary = await create_backend(settings=settings, metrics=ScriptMetrics(backend="local"))
    except (SandboxUnavailable, SandboxFailure) as exc:  # no sandbox at all: nothing is isolated
        return Line(component, (Condition(CONDITION, "Unknown", "NoSandbox", str(exc)),))
    await backend.start()
    try:
        await canary.run_once()
    finally:
        await backend.close()
    c = canary.condition()
    return Line(component, (Condition(c.type, c.status, c.reason, c.message),))


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kubeconfig", help="the cluster's kubeconfig (default: $KUBECONFIG, else ~/.kube/config)")
    parser.add_argument("--context", help="the kubeconfig context to use (default: its current context)")
    parser.add_argument("-n", "--namespace", help="the Agents of this namespace (default: the context's, else default)")
    parser.add_argument("-A", "--all-namespaces", action="store_true", help="the Agents of every namespace")
    parser.add_argument("--scripts-namespace", default=SCRIPTS_NAMESPACE,
                        help="where the scripts-manager runs script pods (the chart's scripts.namespace; "
                        "default: %(default)s)")
    parser.add_argument("--local", action="store_true",
                        help="prove rockbot local's sandbox on this machine instead of reading a cluster")


def run(args: argparse.Namespace) -> int:
    try:
        lines = asyncio.run(_lines(args))
    except _Unreadable as exc:
        print(f"rockbot status: {exc}", file=sys.stderr)
        return 2
    for line in lines:
        print(line.text())
    return 0 if all(line.proven for line in lines) else 1


class _Unreadable(Exception):
    """The cluster (or the sandbox) could not be read; the message says what and how to fix it."""


async def _lines(args: argparse.Namespace) -> list[Line]:
    if args.local:
        return [await local_line()]
    from rockbot.kube import ApiError, KubeClient, KubeConfigError

    try:
        async with await KubeClient.from_environment(config_file=args.kubeconfig, context=args.context) as kube:
            namespace = None if args.all_namespaces else (args.namespace or kube.context_namespace or "default")
            return await cluster_lines(kube, namespace=namespace, scripts_namespace=args.scripts_namespace)
    except KubeConfigError as exc:
        raise _Unreadable(str(exc)) from exc
    except (ApiError, OSError) as exc:
        raise _Unreadable(f"the cluster did not answer as needed ({exc}): reading needs events list in the "
                          "scripts namespace and agents list where the Agents are") from exc
