"""`rockbot eval run` on this machine: the YAML's Evaluations against its Agents, run by `rockbot local`.

The agents run as `rockbot local` runs them (their inbox on the bus, their tools, the local sandbox,
every turn recorded in the SQLite run store with source `evaluation`); the cases are sent as
`service.local`, as the operator sends them in a cluster. A judge's key comes from the Secret
documents in the same files (or `OPENAI_API_KEY` when the judge names no Secret). Each Evaluation's
status after the run is kept as JSON beside the run store, its trend growing run after run, so
`rockbot eval show` reads it as it would read the cluster's.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

from rockbot.bus import Bus, Principal, RequestTimeout
from rockbot.bus.topology import agent_inbox, local_scheduler_replies
from rockbot.contracts.inbox import InboxReply, InboxRequest
from rockbot.evaluations.judging import Judge
from rockbot.evaluations.running import EvaluationResult, Judges, OnVerdict, Send, run_evaluation
from rockbot.local.manifests import NAMESPACE, Manifests
from rockbot.resources.agent import ModelSpec
from rockbot.resources.evaluation import Evaluation, EvaluationStatus


def sender(bus: Bus, *, agent: str) -> Send:
    """Sends a case to `agent`'s inbox as `service.local` and waits for its reply."""
    replies = local_scheduler_replies(instance=secrets.token_hex(4))

    async def send(request: InboxRequest, timeout_seconds: float) -> InboxReply:
        try:
            delivery = await bus.request(
                queue=agent_inbox(namespace=NAMESPACE, name=agent), body=request, reply_queue=replies,
                correlation_id=request.request_id, timeout_seconds=timeout_seconds,
                responder=Principal.agent(namespace=NAMESPACE, name=agent),
            )  # fmt: skip
        except RequestTimeout:
            raise TimeoutError from None
        return delivery.decode(InboxReply)

    return send


def judges(manifests: Manifests, *, base_url: str | None = None, model: str | None = None) -> Judges:
    """A judge for each judge model spec, its key from the files' Secrets (else `OPENAI_API_KEY`); `base_url` and
    `model` (`--judge-base-url`, `--judge-model`) point every judge elsewhere, as `--base-url` does the agents."""

    def judge(spec: ModelSpec) -> Judge:
        ref = spec.api_key_secret_ref
        key = manifests.secrets.get(ref.name, {}).get(ref.key) if ref else None
        return Judge(base_url=base_url or spec.base_url, model=model or spec.name,
                     api_key=key or os.environ.get("OPENAI_API_KEY"),
                     timeout_seconds=spec.request_timeout_seconds)  # fmt: skip

    return judge


async def evaluate(evaluation: Evaluation, *, bus: Bus, judges: Judges,
                   on_verdict: OnVerdict | None = None) -> EvaluationResult:
    return await run_evaluation(evaluation, send=sender(bus, agent=evaluation.spec.agent_ref.name),
                                judges=judges, on_verdict=on_verdict)  # fmt: skip


def results_path(runs_database: Path, name: str) -> Path:
    """Where an Evaluation's status is kept beside the run store: `<store folder>/evaluations/<name>.json`."""
    return runs_database.parent / "evaluations" / f"{name}.json"


def load_status(path: Path) -> EvaluationStatus | None:
    return EvaluationStatus.model_validate_json(path.read_text()) if path.exists() else None


def keep(status: EvaluationStatus, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(status.to_wire(), indent=2) + "\n")

