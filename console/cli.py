"""`rockbot console`: record agents' runs and serve the console (pages and the runs' read API).

Settings come from `ROCKBOT_*` environment variables (see `settings.py`); the flags override the
most common ones. SIGTERM/SIGINT stop taking run events; those not written yet are redelivered.
"""

from __future__ import annotations

import argparse

from rockbot.cli import serve_service


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--database-url", help="the run store: postgresql://... or sqlite:///PATH "
                        "(default: $ROCKBOT_DATABASE_URL, else ~/.local/state/rockbot/runs.db)")
    parser.add_argument("--http-port", type=int, help="port of the pages and /api (default: 8080)")
    parser.add_argument("--health-port", type=int, help="port of /healthz, /readyz, /metrics (default: 8081)")
    parser.add_argument("--log-format", choices=["json", "text"], help="log lines (default: json)")


def run(args: argparse.Namespace) -> int:
    from rockbot.console.service import Console
    from rockbot.console.settings import ConsoleSettings
    from rockbot.kube import KubeConfigError

    return serve_service(ConsoleSettings, lambda settings: Console(settings=settings), command="console",
                         errors=(ValueError, KubeConfigError, OSError), database_url=args.database_url,
                         http_port=args.http_port, health_port=args.health_port, log_format=args.log_format)
