"""`rockbot scripts-manager`: run the service that executes `execute_python_script` requests.

Settings come from `ROCKBOT_*` environment variables (see `settings.py`); the flags below override
the most common ones. SIGTERM/SIGINT stop taking requests and drain the running ones. When the cluster revokes the
manager's credentials (its pod was force-deleted: app.py), it stops the same way and exits with REVOKED_EXIT.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from rockbot.cli import load_settings
from rockbot.logs import setup_logging

#: The exit code after the cluster revoked this process's credentials (its pod is gone: the kubelet ends it soon).
REVOKED_EXIT = 3


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", choices=["pods", "local"], help="sandbox (default: $ROCKBOT_SCRIPTS_BACKEND, "
                        "else pods inside Kubernetes and local elsewhere)")
    parser.add_argument("--concurrency", type=int, help="scripts at once (default: $ROCKBOT_SCRIPTS_CONCURRENCY or 4)")
    parser.add_argument("--health-port", type=int, help="port of /healthz, /readyz, /metrics (default: 8080)")
    parser.add_argument("--log-format", choices=["json", "text"], default="json", help="log lines (default: json)")


def run(args: argparse.Namespace) -> int:
    from rockbot.scripts_manager.backends import SandboxFailure, SandboxUnavailable
    from rockbot.scripts_manager.settings import ScriptsManagerSettings

    setup_logging(log_format=args.log_format)
    settings = load_settings(ScriptsManagerSettings, command="scripts-manager", scripts_backend=args.backend,
                             scripts_concurrency=args.concurrency, health_port=args.health_port)
    if settings is None:
        return 2
    try:
        return asyncio.run(_main(settings))
    except (ValueError, SandboxUnavailable, SandboxFailure) as exc:
        print(f"rockbot scripts-manager: {exc}", file=sys.stderr)
        return 2


async def _main(settings: object) -> int:
    from rockbot.health import serve_until_signalled
    from rockbot.scripts_manager.app import ScriptsManager

    manager = ScriptsManager(settings=settings)  # type: ignore[arg-type]
    serving = asyncio.create_task(serve_until_signalled(manager))
    revoked = asyncio.create_task(manager.revoked.wait())
    await asyncio.wait([serving, revoked], return_when=asyncio.FIRST_COMPLETED)
    revoked.cancel()
    if not serving.done():  # revoked: stop as on SIGTERM (its stop runs on cancellation), then say so
        serving.cancel()
        await asyncio.gather(serving, return_exceptions=True)
        return REVOKED_EXIT
    serving.result()
    return 0
