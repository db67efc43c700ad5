"""The `rockbot` command: one entry point, a subcommand per process.

Subcommands import their process lazily, so `rockbot crds` works without the operator's
dependencies being importable and `--help` stays fast. Every process exports traces as
`rockbot-<subcommand>` when an OTLP endpoint is configured (see `rockbot.telemetry`), and sends
what it still holds when it stops.
"""

from __future__ import annotations

import argparse
import importlib
import pathlib
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from rockbot.health import Service

S = TypeVar("S")

#: subcommand -> (module with `configure(parser)` and `run(args) -> int`, help text)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "operator": ("rockbot.operator.cli", "run the operator that reconciles Agents, Tools and ScheduledTasks"),
    "agent": ("rockbot.agent.cli", "run one agent from its rendered config"),
    "scripts-manager": ("rockbot.scripts_manager.cli", "run the service that executes scripts in sandboxes"),
    "gateway": ("rockbot.gateway.cli", "serve webhook Triggers and start runs from Kubernetes Events"),
    "local": ("rockbot.local.cli", "run the Agents of some YAML files on this machine, with no cluster"),
    "console": ("rockbot.console.cli", "record agents' runs in a database and serve the console and its read API"),
    "runs": ("rockbot.console.runs_cli", "list, show and follow recorded runs (a cluster's console or rockbot local)"),
    "replay": ("rockbot.console.replay_cli", "run a recorded run again against its Agent as it is now (tools live or "
               "answered from the recording) and compare the two runs"),
    "memories": ("rockbot.console.memories_cli", "list, search and forget long-term memories (a cluster's console or "
                 "rockbot local)"),
    "eval": ("rockbot.evaluations.cli", "run Evaluations' cases against their Agents with rockbot local, and show "
             "their results"),
    "openrouter-mcp": ("rockbot.openrouter_mcp.cli", "serve a read-only MCP server for an OpenRouter account"),
    "status": ("rockbot.status", "say whether isolation is proven: the scripts-manager's and each Agent's (or, with "
               "--local, rockbot local's sandbox); exit 1 when not"),
    "crds": ("rockbot.cli", "print the CustomResourceDefinitions, or write them with --write"),
    "docs": ("rockbot.docgen", "list the documentation site's generated reference pages, or write them with --write"),
}


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line and point at --help."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def configure(parser: argparse.ArgumentParser) -> None:
    """Flags of `rockbot crds`."""
    parser.add_argument(
        "--write",
        metavar="DIR",
        type=pathlib.Path,
        nargs="?",
        const=pathlib.Path("crds"),
        help="write the YAML files into DIR (default: ./crds) instead of printing them",
    )


def run(args: argparse.Namespace) -> int:
    """`rockbot crds`: print every CRD as one YAML stream, or write one file per CRD."""
    from rockbot import crdgen

    if args.write is None:
        sys.stdout.write("---\n".join(crdgen.render_all().values()))
    else:
        for path in crdgen.write_all(args.write):
            print(f"wrote {path}")
    return 0


def load_settings(cls: type[S], *, command: str, **flags: object) -> S | None:
    """`cls` (pydantic settings) from its `ROCKBOT_*` variables and the flags given (None: not given); None once
    stderr says what is invalid."""
    from pydantic import ValidationError

    try:
        return cls(**{name: value for name, value in flags.items() if value is not None})
    except ValidationError as exc:
        problems = "; ".join(f"ROCKBOT_{'_'.join(map(str, e['loc'])).upper()}: {e['msg']}" for e in exc.errors())
        print(f"rockbot {command}: invalid settings: {problems}", file=sys.stderr)
        return None


def serve_service(
    settings_cls: type[S], make: Callable[[S], Service], *, command: str,
    errors: tuple[type[BaseException], ...], **flags: object,
) -> int:
    """A service's command: its settings (exit 2 saying what is invalid), its logs as the settings' `log_format`
    says, then the service until SIGTERM; a start-up error of `errors` is one line on stderr and exit 2."""
    import asyncio

    from rockbot.health import serve_until_signalled
    from rockbot.logs import setup_logging

    settings = load_settings(settings_cls, command=command, **flags)
    if settings is None:
        return 2
    setup_logging(log_format=settings.log_format)  # type: ignore[attr-defined]
    try:
        asyncio.run(serve_until_signalled(make(settings)))
    except errors as exc:
        print(f"rockbot {command}: {exc}", file=sys.stderr)
        return 2
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="rockbot", description="Kubernetes-native AI agents with sandboxed Python.")
    from rockbot import __version__

    parser.add_argument("--version", action="version", version=f"rockbot {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    commands.required = True
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        module = importlib.import_module(module_name)
        sub = commands.add_parser(name, help=help_text, description=help_text[0].upper() + help_text[1:] + ".")
        module.configure(sub)
        sub.set_defaults(_module=module)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from rockbot.telemetry import flush_tracing, setup_tracing

    parser = build_parser()
    args = parser.parse_args(argv)
    setup_tracing(service=f"rockbot-{args.command}")  # only with OTEL_EXPORTER_OTLP_* set
    try:
        return int(args._module.run(args) or 0)
    except KeyboardInterrupt:
        return 130
    finally:
        flush_tracing()


if __name__ == "__main__":
    sys.exit(main())
