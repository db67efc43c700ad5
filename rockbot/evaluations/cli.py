"""`rockbot eval run|show|from-runs`: an Evaluation's cases against its Agent on this machine, the results kept,
and recorded runs made into cases (`console.eval_cases`).

`run` starts the files' Agents as `rockbot local` does and runs every Evaluation in them (or those named),
printing a line per case run and a summary per Evaluation; it exits 1 when any Evaluation's pass ratio is
under its `passRatio` (a CI step fails), 2 when the files cannot be used. `show` prints an Evaluation's
kept status: its cases, its score and its trend.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pathlib
import sys

#: Exit codes: every Evaluation passed / one scored under its passRatio / the input could not be used.
PASSED, UNDER_THRESHOLD, UNUSABLE = 0, 1, 2
_MARKS = {"Passed": "✓", "Failed": "✗", "Error": "!"}


def configure(parser: argparse.ArgumentParser) -> None:
    from rockbot.local.cli import configure_agents

    commands = parser.add_subparsers(dest="eval_command", metavar="COMMAND", parser_class=type(parser))
    commands.required = True
    running = commands.add_parser("run", help="run the Evaluations of some YAML files with rockbot local",
                                  description="Run the Evaluations of some YAML files against their Agents, on "
                                  "this machine; exit 1 when one scores under its passRatio.")  # fmt: skip
    running.add_argument("paths", nargs="+", type=pathlib.Path, metavar="PATH",
                         help="YAML file or folder of Evaluations, their Agents, Tools and Secrets")  # fmt: skip
    running.add_argument("--evaluation", action="append", dest="names", metavar="NAME",
                         help="run only this Evaluation (repeatable; default: every one in the files)")
    running.add_argument("--json", action="store_true", help="print each Evaluation's status as JSON on stdout")
    running.add_argument("--judge-base-url", help="grade rubric cases with this endpoint instead of the judges' own")
    running.add_argument("--judge-model", help="grade rubric cases with this model instead of the judges' own")
    configure_agents(running)
    running.set_defaults(_eval=_run)
    showing = commands.add_parser("show", help="show an Evaluation's results as rockbot eval run kept them",
                                  description="Show an Evaluation's last results and trend.")
    showing.add_argument("name", help="the Evaluation")
    showing.add_argument("--runs-database", type=pathlib.Path, default=None,
                         help="the run store whose folder keeps the results (default: rockbot local's)")
    showing.add_argument("--json", action="store_true", help="print the status as JSON")
    showing.set_defaults(_eval=_show)
    from rockbot.console import eval_cases

    from_runs = commands.add_parser("from-runs", help="turn recorded runs into an Evaluation's cases (YAML)",
                                    description="Print an Evaluation of the runs' Agent with a case per run: its "
                                    "input and the tools it called.")  # fmt: skip
    eval_cases.configure(from_runs)
    from_runs.set_defaults(_eval=eval_cases.run)


def run(args: argparse.Namespace) -> int:
    return args._eval(args)


def _run(args: argparse.Namespace) -> int:
    from rockbot.local.cli import INTERRUPTED, interruptible, prepare

    args.paths = list(args.paths)
    prepared = prepare(args, command="rockbot eval run")
    if isinstance(prepared, int):
        return prepared
    manifests, agents, scripts, _ = prepared
    names = args.names or list(manifests.evaluations)
    missing = [name for name in names if name not in manifests.evaluations]
    if not names or missing:
        there = ", ".join(manifests.evaluations) or "none"
        what = f"no Evaluation {', '.join(map(repr, missing))}" if missing else "no Evaluation"
        print(f"rockbot eval run: {what} in {', '.join(map(str, args.paths))} (there are: {there}): add a "
              "`kind: Evaluation` document naming one of the Agents", file=sys.stderr)  # fmt: skip
        return UNUSABLE
    try:
        return asyncio.run(interruptible(_evaluate(args, manifests=manifests, agents=agents, scripts=scripts,
                                                   names=names)))  # fmt: skip
    except (KeyboardInterrupt, asyncio.CancelledError):
        return INTERRUPTED


async def _evaluate(args: argparse.Namespace, *, manifests, agents, scripts, names: list[str]) -> int:
    from rockbot.bus import LOCAL, BusError
    from rockbot.local import broker
    from rockbot.local.app import running
    from rockbot.local.cli import runs_database
    from rockbot.local.evaluating import evaluate, judges, keep, load_status, results_path
    from rockbot.resources.evaluation import Evaluation

    configs = [assembled.config for assembled in agents.values()]
    try:
        connect = (await broker.on_rabbitmq(configs, amqp_url=args.amqp_url, management_url=args.management_url)
                   if args.amqp_url else await broker.in_memory(configs))  # fmt: skip
    except BusError as error:
        print(f"rockbot eval run: {error}", file=sys.stderr)
        return UNUSABLE
    database = runs_database(args)
    judge = judges(manifests, base_url=args.judge_base_url, model=args.judge_model)
    verdict = PASSED
    async with running(connect=connect, agents=agents, tasks=[], report=lambda *_: None, scripts=scripts,
                       runs_database=database) as local, await connect(LOCAL) as bus:  # fmt: skip
        for name in names:
            evaluation = Evaluation.model_validate(manifests.evaluations[name])
            agent = evaluation.spec.agent_ref.name
            print(f"[evaluation {name}: {len(evaluation.spec.cases)} case(s) x {evaluation.spec.repeat} against "
                  f"{agent} ({local.agents[agent].config.model.name})]", file=sys.stderr)  # fmt: skip
            result = await evaluate(evaluation, bus=bus, judges=judge, on_verdict=_print_verdict)
            path = results_path(database, name) if database is not None else None
            status = result.status(previous=load_status(path) if path else None, generation=None,
                                   agent_generation=None, model=local.agents[agent].config.model.name)  # fmt: skip
            if path is not None:
                keep(status, path)
            ran = sum(case.runs for case in status.cases)
            passed = sum(case.passed for case in status.cases)
            print(f"[evaluation {name}: score {result.score:.2f} ({passed} of {ran} case runs passed), passRatio "
                  f"{evaluation.spec.pass_ratio:g}: {'PASSED' if result.passed else 'FAILED'}]", file=sys.stderr)
            if args.json:
                print(json.dumps({"name": name, "status": status.to_wire()}))
            if not result.passed:
                verdict = UNDER_THRESHOLD
    return verdict


def _print_verdict(case, attempt: int, verdict) -> None:
    why = f": {verdict.message}" if verdict.result != "Passed" else ""
    score = f" (judge {verdict.score:.2f})" if verdict.score is not None else ""
    print(f"  {_MARKS[verdict.result]} {case.name} #{attempt}{score}{why}", file=sys.stderr, flush=True)


def _show(args: argparse.Namespace) -> int:
    from rockbot.console.settings import DEFAULT_DATABASE
    from rockbot.local.evaluating import load_status, results_path

    path = results_path(args.runs_database or DEFAULT_DATABASE, args.name)
    status = load_status(path)
    if status is None:
        print(f"rockbot eval show: no results of {args.name!r} in {path.parent}: run `rockbot eval run FILE` first",
              file=sys.stderr)
        return UNUSABLE
    if args.json:
        print(json.dumps(status.to_wire(), indent=2))
        return PASSED
    print(f"{args.name}: score {status.score:.2f} against {status.model} at {status.last_run_time:%Y-%m-%d %H:%M:%S}Z")
    for case in status.cases:
        score = f" judge {case.score:.2f}" if case.score is not None else ""
        why = f"  {case.message}" if case.message else ""
        print(f"  {_MARKS[case.result]} {case.name:<24} {case.passed}/{case.runs}{score}{why}")
    print("trend: " + " ".join(f"{run.score:.2f}{'' if run.passed else '!'}" for run in status.trend))
    return PASSED
