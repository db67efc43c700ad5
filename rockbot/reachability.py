"""Isolation proven, not assumed: what an isolation canary tries to reach, and what it found.

A NetworkPolicy is only a request: on a cluster whose network plugin does not enforce policies the
API server stores them and nothing happens. So the scripts-manager (for script pods) and the operator
(for agent pods) run a canary: a pod made like theirs whose program (`reach_probe.py`) tries every
configured target, and reports which it reached. A finding is a sample in time, not a guarantee.

Targets are grouped by probe (`clusterDns`, `kubernetesApi`, `broker`, `metadata`, `outside`), each a
list of `tcp://HOST:PORT`, `dns:NAME` or `dns://SERVER:PORT/NAME`; an empty list turns that probe off.
"""

from __future__ import annotations

import datetime
import json
import urllib.parse
from importlib.resources import files
from typing import Literal

from prometheus_client import CollectorRegistry, Gauge
from pydantic import BaseModel, ConfigDict

from rockbot.conditions import ConditionUpdate
from rockbot.reach_probe import RESULT_KEY

#: The canary's program, run by `python3 -I -c` (standard library only).
PROBE = files("rockbot").joinpath("reach_probe.py").read_text()
#: The condition the canaries report (on the scripts-manager's readiness, on each Agent).
CONDITION = "EgressRestricted"
#: What the cluster needs when a canary reached something it must not.
ENFORCE_FIX = (
    "this cluster does not enforce NetworkPolicy: use a network plugin that does (Calico, Cilium, Antrea, "
    "or your cloud's network policy option) and check that its agent runs on every node"
)
#: How long one target may take to answer.
PROBE_TIMEOUT_SECONDS = 3.0
#: The annotation of each script canary's Event that holds its proof (`PublishedProof`, JSON) for `rockbot status`.
PROOF_ANNOTATION = "rockbot.dev/isolation-proof"

Targets = dict[str, list[str]]


def check_target(uri: str) -> str:
    """`uri` if the probe understands it; else ValueError naming the forms it does."""
    parts = urllib.parse.urlsplit(uri)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme == "tcp" and parts.hostname and port:
        return uri
    if parts.scheme == "dns" and ((parts.netloc and parts.hostname and parts.path.strip("/")) or
                                  (not parts.netloc and parts.path)):
        return uri
    raise ValueError(f"{uri!r} is not a canary target: write tcp://HOST:PORT, dns:NAME or dns://SERVER:PORT/NAME")


def check_targets(targets: Targets) -> Targets:
    for uris in targets.values():
        for uri in uris:
            check_target(uri)
    return targets


class Finding(BaseModel):
    """One target, as the canary found it."""

    model_config = ConfigDict(frozen=True)

    probe: str
    target: str
    reached: bool
    detail: str = ""

    def describe(self) -> str:
        return f"{self.probe} ({self.target})"


class Proof(BaseModel):
    """One canary run: when, what it found, or why it could not run."""

    model_config = ConfigDict(frozen=True)

    at: datetime.datetime
    findings: tuple[Finding, ...] = ()
    #: Why the canary could not run (None: it ran).
    error: str | None = None

    @property
    def reached(self) -> list[Finding]:
        return [finding for finding in self.findings if finding.reached]

    @property
    def isolated(self) -> bool:
        """Ran and reached nothing (or had nothing to try: every probe turned off)."""
        return self.error is None and not self.reached

    @property
    def off(self) -> bool:
        """Nothing was tried: every probe is turned off."""
        return self.error is None and not self.findings

    def condition(self, *, pods: str, fix: str = ENFORCE_FIX, stamped: bool = True) -> ConditionUpdate:
        """EgressRestricted: True (ran, reached nothing), False (reached something), Unknown (could not run).

        `stamped` puts the proof's time in the message (not on an object's status: each proof would be a write).
        """
        when = f"at {self.at.strftime('%Y-%m-%dT%H:%M:%SZ')}" if stamped else "in its last run"
        if self.error is not None:
            return ConditionUpdate(type=CONDITION, status="Unknown", reason="CanaryFailed",
                                   message=f"the isolation canary could not run {when}: {self.error}")
        if self.off:
            return ConditionUpdate(type=CONDITION, status="Unknown", reason="CanaryOff",
                                   message="every isolation canary target is turned off: nothing is proven")
        if self.reached:
            return ConditionUpdate(
                type=CONDITION, status="False", reason="TargetsReached",
                message=f"{pods} reached {', '.join(f.describe() for f in self.reached)} {when}: {fix}",
            )  # fmt: skip
        tried = ", ".join(f.describe() for f in self.findings)
        return ConditionUpdate(type=CONDITION, status="True", reason="NothingReached",
                               message=f"{pods} reached none of {tried} {when}")


class PublishedProof(BaseModel):
    """One proof as the scripts-manager publishes it (an Event's annotation) and `rockbot status` reads it."""

    status: Literal["True", "False", "Unknown"]
    reason: str
    message: str
    at: datetime.datetime
    reached: list[str] = []
    enforce: bool
    #: When the next proof is due (seconds after `at`): a reader tells a stopped canary from a quiet one.
    interval_seconds: float

    @classmethod
    def of(cls, proof: Proof, condition: ConditionUpdate, *, enforce: bool, interval_seconds: float) -> PublishedProof:
        return cls(status=condition.status, reason=condition.reason, message=condition.message, at=proof.at,
                   reached=[f.target for f in proof.reached], enforce=enforce, interval_seconds=interval_seconds)


def probe_input(targets: Targets, *, timeout: float = PROBE_TIMEOUT_SECONDS) -> str:
    """The probe's stdin: every target once."""
    return json.dumps({"targets": uris(targets), "timeout_seconds": timeout})


def uris(targets: Targets) -> list[str]:
    return list(dict.fromkeys(uri for group in targets.values() for uri in group))


def findings(output: str, *, targets: Targets) -> tuple[Finding, ...]:
    """The probe's answer in `output` as findings, each named by its probe; ValueError if there is none."""
    for line in reversed(output.splitlines()):
        try:
            said = json.loads(line)
        except ValueError:
            continue
        if isinstance(said, dict) and isinstance(said.get(RESULT_KEY), list):
            by_target = {item["target"]: item for item in said[RESULT_KEY] if isinstance(item, dict)}
            missing = [uri for uri in uris(targets) if uri not in by_target]
            if missing:
                raise ValueError(f"the canary's answer says nothing of {', '.join(missing)}")
            return tuple(
                Finding(probe=probe, target=uri, reached=by_target[uri].get("reached") is True,
                        detail=str(by_target[uri].get("detail", ""))[:200])
                for probe, group in targets.items() for uri in group
            )  # fmt: skip
    raise ValueError(f"the canary printed no answer: {output.strip()[-300:]!r}")


def now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)



class IsolationMetrics:
    """`rockbot_isolation_reachable{scope,target}` (0/1) and the time of the last proof, in `registry`."""

    def __init__(self, *, registry: CollectorRegistry, scope: str) -> None:
        self._scope = scope
        self.reachable = Gauge(
            "rockbot_isolation_reachable", "Whether the last isolation canary reached a target (1) or not (0).",
            ["scope", "target"], registry=registry,
        )  # fmt: skip
        self.last_proof = Gauge(
            "rockbot_isolation_last_proof_timestamp_seconds",
            "When an isolation canary last ran and reached nothing (Unix time; 0: never).",
            ["scope"], registry=registry,
        )  # fmt: skip
        self.last_proof.labels(scope)

    def record(self, proof: Proof) -> None:
        for finding in proof.findings:
            self.reachable.labels(self._scope, finding.target).set(1 if finding.reached else 0)
        if proof.isolated and not proof.off:
            self.last_proof.labels(self._scope).set(proof.at.timestamp())
