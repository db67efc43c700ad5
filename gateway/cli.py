"""`rockbot gateway`: serve the webhook Triggers and watch the Events that event Triggers select.

Settings come from `ROCKBOT_*` environment variables (see `settings.py`); the flags below override
the most common ones. SIGTERM/SIGINT stop taking webhooks and finish recording the ones taken.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from rockbot.cli import load_settings
from rockbot.logs import setup_logging


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--webhook-port", type=int, help="port of /hooks/<namespace>/<name> (default: 8443)")
    parser.add_argument("--public-url", help="where senders reach the webhooks, for the URL in each Trigger's status "
                        "(default: $ROCKBOT_PUBLIC_URL)")
    parser.add_argument("--health-port", type=int, help="port of /healthz, /readyz, /metrics (default: 8080)")
    parser.add_argument("--log-format", choices=["json", "text"], help="log lines (default: json)")


def run(args: argparse.Namespace) -> int:
    from rockbot.gateway.settings import GatewaySettings
    from rockbot.kube import KubeConfigError

    settings = load_settings(GatewaySettings, command="gateway", webhook_port=args.webhook_port,
                             public_url=args.public_url, health_port=args.health_port, log_format=args.log_format)
    if settings is None:
        return 2
    setup_logging(log_format=settings.log_format)
    try:
        asyncio.run(_main(settings))
    except (ValueError, KubeConfigError, OSError) as exc:
        print(f"rockbot gateway: {exc}", file=sys.stderr)
        return 2
    return 0


async def _main(settings: object) -> None:
    from rockbot.gateway.app import Gateway
    from rockbot.health import serve_until_signalled

    await serve_until_signalled(Gateway(settings=settings))  # type: ignore[arg-type]
