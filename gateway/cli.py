"""`rockbot gateway`: serve the webhook Triggers and watch the Events that event Triggers select.

Settings come from `ROCKBOT_*` environment variables (see `settings.py`); the flags below override
the most common ones. SIGTERM/SIGINT stop taking webhooks and finish recording the ones taken.
"""

from __future__ import annotations

import argparse

from rockbot.cli import serve_service


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--webhook-port", type=int, help="port of /hooks/<namespace>/<name> (default: 8443)")
    parser.add_argument("--public-url", help="where senders reach the webhooks, for the URL in each Trigger's status "
                        "(default: $ROCKBOT_PUBLIC_URL)")
    parser.add_argument("--health-port", type=int, help="port of /healthz, /readyz, /metrics (default: 8080)")
    parser.add_argument("--log-format", choices=["json", "text"], help="log lines (default: json)")


def run(args: argparse.Namespace) -> int:
    from rockbot.gateway.app import Gateway
    from rockbot.gateway.settings import GatewaySettings
    from rockbot.kube import KubeConfigError

    return serve_service(GatewaySettings, lambda settings: Gateway(settings=settings), command="gateway",
                         errors=(ValueError, KubeConfigError, OSError), webhook_port=args.webhook_port,
                         public_url=args.public_url, health_port=args.health_port, log_format=args.log_format)
