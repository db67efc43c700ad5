"""`rockbot console`: record agents' runs and serve the console (pages and the runs' read API).

Settings come from `ROCKBOT_*` environment variables (see `settings.py`); the flags override the
most common ones. SIGTERM/SIGINT stop taking run events; those not written yet are redelivered.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from rockbot.cli import load_settings
from rockbot.logs import setup_logging


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--database-url", help="the run store: postgresql://... or sqlite:///PATH "
                        "(default: $ROCKBOT_DATABASE_URL, else ~/.local/state/rockbot/runs.db)")
    parser.add_argument("--http-port", type=int, help="port of the pages and /api (default: 8080)")
    parser.add_argument("--health-port", type=int, help="port of /healthz, /readyz, /metrics (default: 8081)")
    parser.add_argument("--log-format", choices=["json", "text"], help="log lines (default: json)")


def run(args: argparse.Namespace) -> int:
    from rockbot.console.settings import ConsoleSettings
    from rockbot.kube import KubeConfigError

    settings = load_settings(ConsoleSettings, command="console", database_url=args.database_url,
                             http_port=args.http_port, health_port=args.health_port, log_format=args.log_format)
    if settings is None:
        return 2
    setup_logging(log_format=settings.log_format)
    try:
        asyncio.run(_main(settings))
    except (ValueError, KubeConfigError, OSError) as exc:
        print(f"rockbot console: {exc}", file=sys.stderr)
        return 2
    return 0


async def _main(settings: object) -> None:
    from rockbot.console.service import Console
    from rockbot.health import serve_until_signalled

    await serve_until_signalled(Console(settings=settings))  # type: ignore[arg-type]
