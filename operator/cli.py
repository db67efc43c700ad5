"""`rockbot operator`: flags override the `ROCKBOT_*` environment."""

from __future__ import annotations

import argparse
import asyncio
import logging

from rockbot.operator.settings import OperatorSettings


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-n",
        "--namespace",
        dest="namespaces",
        action="append",
        metavar="NS",
        help="watch this namespace (repeatable); default: $ROCKBOT_NAMESPACES, else the whole cluster",
    )
    parser.add_argument("--agent-image", help="default image for agent pods ($ROCKBOT_AGENT_IMAGE)")
    parser.add_argument("--log-format", choices=["json", "text"], help="log format ($ROCKBOT_LOG_FORMAT)")
    parser.add_argument(
        "--liveness",
        metavar="URL",
        default="http://0.0.0.0:8080/healthz",
        help="serve liveness on this URL (default: %(default)s); 'off' disables it",
    )


def run(args: argparse.Namespace) -> int:
    from rockbot.logs import setup_logging
    from rockbot.operator.runner import run_operator

    overrides = {
        key: value
        for key, value in {
            "namespaces": args.namespaces,
            "agent_image": args.agent_image,
            "log_format": args.log_format,
        }.items()
        if value is not None
    }
    settings = OperatorSettings(**overrides)
    setup_logging(log_format=settings.log_format, level=logging.INFO)
    liveness = None if args.liveness == "off" else args.liveness
    asyncio.run(run_operator(settings, liveness_endpoint=liveness))
    return 0
