"""`rockbot eval from-runs RUN_ID...`: recorded runs a person found good, as the cases of an Evaluation (YAML).

    rockbot eval from-runs 3f2a9c... 7b1d0e... --url https://console.example.com --token "$TOKEN" > evaluation.yaml

Each run becomes a case: its input (the first user message; the earlier turns of its session are not taken: add
them as `priorTurns` where the case needs them), and what the recorded answer shows must hold again: the tools it
called (`mustCall`), or, when it called none, that it calls none (`maxToolCalls: 0`). The answer's wording is not
checked (a model words it anew each time): add `contains`, `regex` or a `rubric` by hand where a fact matters.
Every run must be one of the same Agent, recorded in `Full` and `Succeeded` (a failed run is no example of a good
answer). The runs are read as `rockbot runs` reads them: from the console (`--url`, as the token's user) or
`rockbot local`'s SQLite store.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
from typing import Any

import yaml
from pydantic import ValidationError

from rockbot.console.runs_cli import RunSource, configure_source, open_runs
from rockbot.console.store_models import RunDetail
from rockbot.resources import Evaluation


class NotACase(ValueError):
    """A run that cannot be a case; the message names it and says why."""


def case_of(run: RunDetail) -> dict[str, Any]:
    """The Evaluation case (`spec.cases[]`, camelCase) that a good recorded run is an example of."""
    if run.record != "Full":
        raise NotACase(f"run {run.run_id} was recorded with {run.record}: it kept no input (record Full runs)")
    if run.outcome != "Succeeded":
        raise NotACase(f"run {run.run_id} ended {run.outcome or 'not yet'}: pick runs that went well")
    messages = [e for e in run.timeline if e.kind == "message"]
    first = next((i for i, e in enumerate(messages) if e.name == "user" and e.data.get("content")), None)
    if first is None:
        raise NotACase(f"run {run.run_id} recorded no user message")
    called = list(dict.fromkeys(e.name for e in run.timeline if e.kind == "tool_call"))
    case: dict[str, Any] = {"name": _name(run.run_id), "input": str(messages[first].data["content"])}
    expect: dict[str, Any] = {"mustCall": called} if called else {"maxToolCalls": 0}
    return {**case, "expect": expect}


def evaluation_of(runs: list[RunDetail], *, name: str | None = None) -> dict[str, Any]:
    """An Evaluation of the runs' Agent with a case per run, in the order given."""
    agents = {(run.namespace, run.agent) for run in runs}
    if len(agents) != 1:
        listed = ", ".join(sorted(f"{n}/{a}" for n, a in agents))
        raise NotACase(f"the runs are of {len(agents)} Agents ({listed}): an Evaluation tests one, so pick runs of one")
    namespace, agent = agents.pop()
    document = {
        "apiVersion": "rockbot.dev/v1alpha1",
        "kind": "Evaluation",
        "metadata": {"name": name or f"{agent}-from-runs"[:63], "namespace": namespace},
        "spec": {"agentRef": {"name": agent}, "cases": [case_of(run) for run in runs]},
    }
    try:
        Evaluation.model_validate(document)  # what kubectl apply and rockbot eval run will take
    except ValidationError as exc:
        raise NotACase(f"the runs make no valid Evaluation: {exc}") from None
    return document


def _name(run_id: str) -> str:
    """A case name (a DNS label) from the run id's own random part."""
    return "run-" + re.sub(r"[^a-z0-9]", "", run_id.rpartition("-")[2].lower())[:16]


def configure(parser: argparse.ArgumentParser) -> None:
    """The `from-runs` verb's arguments (`rockbot eval from-runs`)."""
    parser.add_argument("run_ids", nargs="+", metavar="RUN_ID", help="recorded runs of one Agent (rockbot runs list)")
    parser.add_argument("--name", help="the Evaluation's name (default: <agent>-from-runs)")
    configure_source(parser)


def run(args: argparse.Namespace) -> int:
    try:
        document = asyncio.run(_main(args))
    except (NotACase, RuntimeError, OSError) as exc:
        print(f"rockbot eval from-runs: {exc}", file=sys.stderr)
        return 1
    print(f"# rockbot eval from-runs {' '.join(args.run_ids)}")
    yaml.safe_dump(document, sys.stdout, sort_keys=False, allow_unicode=True, width=120)
    return 0


async def _main(args: argparse.Namespace) -> dict[str, Any]:
    source: RunSource = await open_runs(args)
    try:
        runs = []
        for run_id in args.run_ids:
            found = await source.get_run(run_id)
            if found is None:
                raise NotACase(f"no run {run_id!r} that you may read")
            runs.append(found)
    finally:
        await source.close()
    return evaluation_of(runs, name=args.name)
