"""`rockbot local -f examples/`: chat with the Agents of some YAML files, on this machine, with no cluster."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import pathlib
import signal
import sys

#: The exit code of a run ended by Ctrl-C (128 + SIGINT, as shells report it).
INTERRUPTED = 130


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-f",
        "--filename",
        dest="paths",
        action="append",
        type=pathlib.Path,
        required=True,
        metavar="PATH",
        help="YAML file or folder of Agents, Tools, ScheduledTasks, Triggers and Secrets (repeatable)",
    )
    parser.add_argument("--agent", help="the Agent to chat with (default: the first one)")
    parser.add_argument("--prompt", help="answer this one message and exit, instead of an interactive chat")
    configure_agents(parser)
    parser.add_argument(
        "--webhook-port",
        type=int,
        default=8090,
        help="serve the webhook Triggers at http://127.0.0.1:PORT/hooks/local/<name> (default: %(default)s; "
        "0 picks a free port)",
    )
    parser.add_argument(
        "--console-port", type=int, default=8080,
        help="serve the console (agents, runs, chat, approvals; no login) at http://127.0.0.1:PORT "
        "(default: %(default)s; 0 picks a free port)",
    )
    parser.add_argument("--no-console", action="store_true", help="serve no console")


def configure_agents(parser: argparse.ArgumentParser) -> None:
    """The flags of how the files' Agents run here (their model, bus, sandbox, run store, logs): the chat's and
    `rockbot eval run`'s."""
    parser.add_argument(
        "--base-url",
        default=os.environ.get("OPENAI_BASE_URL"),
        help="OpenAI-compatible endpoint for every agent (default: $OPENAI_BASE_URL, else each Agent's own "
        "spec.model.baseUrl)",
    )
    parser.add_argument(
        "--model",
        default=os.environ.get("OPENAI_MODEL"),
        help="model name for every agent (default: $OPENAI_MODEL, else each Agent's own)",
    )
    parser.add_argument(
        "--amqp-url",
        help="use this RabbitMQ instead of the in-memory bus; it must log in as an administrator, who creates a "
        "login per agent for this run",
    )
    parser.add_argument(
        "--management-url",
        help="RabbitMQ's management API for --amqp-url (default: the AMQP host on port 15672)",
    )
    parser.add_argument(
        "--unsafe-no-sandbox",
        action="store_true",
        help="run scripts without isolation when no sandbox primitive works (not recommended)",
    )
    parser.add_argument(
        "--runs-database", type=pathlib.Path, default=None,
        help="record every turn in this SQLite run store (default: ~/.local/state/rockbot/runs.db; read it with "
        "`rockbot runs`)",
    )
    parser.add_argument("--no-runs", action="store_true", help="record no runs")
    parser.add_argument(
        "-v", "--verbose", action="store_true", help="show the processes' logs here instead of in the log file"
    )


def run(args: argparse.Namespace) -> int:
    prepared = prepare(args, command="rockbot local")
    if isinstance(prepared, int):
        return prepared
    manifests, agents, scripts, log_file = prepared
    chosen = args.agent or next(iter(manifests.agents))
    if chosen not in manifests.agents:
        print(f"rockbot local: no Agent {chosen!r}; there are: {', '.join(manifests.agents)}", file=sys.stderr)
        return 2
    try:
        return asyncio.run(interruptible(_main(args, manifests=manifests, agents=agents, chosen=chosen,
                                                scripts=scripts, log_file=log_file)))  # fmt: skip
    except (KeyboardInterrupt, asyncio.CancelledError):
        return INTERRUPTED


def prepare(args: argparse.Namespace, *, command: str):
    """The files' manifests, their Agents assembled, the local sandbox's settings and the log file; or the exit code
    (2) once stderr says what is wrong. Shared by the chat and `rockbot eval run`."""
    from rockbot.local.assembly import LocalModel, assemble
    from rockbot.local.logfile import default_path, log_to_file
    from rockbot.local.manifests import ManifestError, load, script_limit_problems
    from rockbot.logs import setup_logging
    from rockbot.scripts_manager.settings import ScriptsManagerSettings

    setup_logging(log_format="text", level=logging.INFO if args.verbose else logging.WARNING)
    log_file = None if args.verbose else log_to_file(default_path())
    scripts = ScriptsManagerSettings(
        scripts_backend="local",
        health_host="127.0.0.1",
        health_port=0,
        scripts_local_isolation="unsafe-none" if args.unsafe_no_sandbox else "auto",
        # Asked for: scripts run although the sandbox's canary reaches the host (and it says so).
        scripts_isolation_enforce=not args.unsafe_no_sandbox,
    )
    try:
        manifests = load(args.paths)
        limits = script_limit_problems(manifests, max_cpu=scripts.scripts_max_cpu,
                                       max_memory=scripts.scripts_max_memory)  # fmt: skip
        if limits:
            raise ManifestError(limits)
    except ManifestError as error:
        return _refused(error, command=command)
    if not manifests.agents:
        print(
            f"{command}: no Agent in {', '.join(map(str, args.paths))}: add a `kind: Agent` document",
            file=sys.stderr,
        )
        return 2
    model = LocalModel(
        base_url=args.base_url,
        name=args.model,
        api_key_env="OPENAI_API_KEY" if os.environ.get("OPENAI_API_KEY") else None,
    )
    try:
        agents = assemble(manifests, model=model)
    except ManifestError as error:
        return _refused(error, command=command)
    for warning in manifests.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    for name, assembled in agents.items():
        for warning in assembled.warnings:
            print(f"warning: Agent {name}: {warning}", file=sys.stderr)
    return manifests, agents, scripts, log_file


def _refused(error, *, command: str) -> int:
    for problem in error.problems:
        print(f"{command}: {problem}", file=sys.stderr)
    return 2


async def interruptible(main) -> int:
    """Run `main`; the first Ctrl-C cancels it (its parts stop in order, and the terminal says what it waits
    for), a second one exits at once."""
    task = asyncio.current_task()
    assert task is not None

    def interrupted() -> None:
        if task.cancelling():
            print("\n[stopped at once]", file=sys.stderr, flush=True)
            os._exit(INTERRUPTED)
        print("\n[stopping: ending the turn in progress, then the agents, the scheduler and the sandbox; Ctrl-C "
              "again quits at once]", file=sys.stderr, flush=True)  # fmt: skip
        task.cancel()

    asyncio.get_running_loop().add_signal_handler(signal.SIGINT, interrupted)
    return await main


async def _main(args: argparse.Namespace, *, manifests, agents, chosen: str, scripts, log_file=None) -> int:
    from rockbot.bus import BusError
    from rockbot.local import broker
    from rockbot.local.app import running
    from rockbot.local.approving import TerminalApprover
    from rockbot.local.chat import Printer
    from rockbot.local.terminal import Terminal
    from rockbot.local.triggers import PortUnavailable
    from rockbot.resources import ScheduledTask

    tasks = [ScheduledTask.model_validate(body) for body in manifests.tasks.values()]
    printer = Printer()
    terminal = Terminal()
    approver = TerminalApprover(terminal=terminal)  # a call that needs approval asks here: approve? [y/N]
    configs = [assembled.config for assembled in agents.values()]
    try:
        if args.amqp_url:
            connect = await broker.on_rabbitmq(configs, amqp_url=args.amqp_url, management_url=args.management_url)
        else:
            connect = await broker.in_memory(configs)
    except BusError as error:
        print(f"rockbot local: {error}", file=sys.stderr)
        return 1
    try:
        async with running(
            connect=connect, agents=agents, tasks=tasks, report=printer.task_report, scripts=scripts,
            triggers=list(manifests.triggers.values()), keys=manifests.secrets, trigger_report=printer.trigger_report,
            webhook_port=args.webhook_port, runs_database=runs_database(args), approvals_over_bus=not args.no_console,
        ) as local:
            if args.no_console:
                for runtime in local.agents.values():
                    runtime.approvals.approver = approver
                return await _session(args, local=local, manifests=manifests, chosen=chosen, printer=printer,
                                      log_file=log_file, terminal=terminal)  # fmt: skip
            return await _with_console(args, connect=connect, local=local, manifests=manifests, chosen=chosen,
                                       printer=printer, log_file=log_file, terminal=terminal, approver=approver)
    except PortUnavailable as error:
        print(f"rockbot local: {error}", file=sys.stderr)
        return 1


def runs_database(args: argparse.Namespace) -> pathlib.Path | None:
    from rockbot.console.settings import DEFAULT_DATABASE

    return None if args.no_runs else (args.runs_database or DEFAULT_DATABASE)


async def _with_console(args: argparse.Namespace, *, connect, local, manifests, chosen: str, printer, log_file,
                        terminal, approver) -> int:
    """The session with the console served beside it; a call of the terminal's own turns is asked in both."""
    from rockbot.bus import LOCAL
    from rockbot.local import console
    from rockbot.local.approving import ConsoleAndTerminal
    from rockbot.local.chat import SESSION

    both = ConsoleAndTerminal(approver=approver, conversations={
        local.agents[chosen].conversation(caller=LOCAL.user, session_id=SESSION).id})
    async with console.serving(connect=connect, store=local.store, manifests=manifests, agents=local.agents,
                               port=args.console_port, on_pending=both.on_pending) as served:
        both.desk = served.desk
        print(f"[console: {served.url} (no login: this machine only)]", file=sys.stderr)
        return await _session(args, local=local, manifests=manifests, chosen=chosen, printer=printer,
                              log_file=log_file, terminal=terminal)


async def _session(args: argparse.Namespace, *, local, manifests, chosen: str, printer, log_file, terminal) -> int:
    """The chat (or the one --prompt) while every part runs."""
    from rockbot.local.chat import ask, banner, isolation_line

    agent = local.agents[chosen]
    print(banner(chosen, agent), file=sys.stderr)
    print(await isolation_line(local.scripts), file=sys.stderr)
    for name, runtime in local.agents.items():
        for notice in runtime.notices:
            print(f"[{name}: {notice}]", file=sys.stderr)
    for name, body in manifests.triggers.items():
        print(f"[trigger {name}: POST http://127.0.0.1:{local.webhook_port}/hooks/local/{name} runs "
              f"{body['spec']['agentRef']['name']}]", file=sys.stderr)
    if log_file is not None and log_file.warnings:
        print(f"[{log_file.warnings} warning(s) while starting: see {log_file.path}]", file=sys.stderr)
    if args.prompt is not None:
        return 0 if await ask(agent, args.prompt, printer=printer) else 1
    print("[type a message; an empty line or Ctrl-D ends the chat]", file=sys.stderr)
    while True:
        line = await terminal.line("you> ")
        if line is None or not line.strip():
            return 0
        await ask(agent, line, printer=printer)

