"""`rockbot operator`: one flag per `OperatorSettings` field, overriding its `ROCKBOT_*` variable.

The flags are derived from the settings model, so a new setting gets its flag (and its help, from
the field's description) without touching this file. Bad values, from a flag or the environment,
and a missing kubeconfig end in one line naming the flag, variable or file and the fix (exit 2).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import typing

import pydantic
from pydantic.fields import FieldInfo

from rockbot.operator.settings import OperatorSettings

ENV_PREFIX = "ROCKBOT_"
_ALIASES: dict[str, tuple[str, ...]] = {"namespaces": ("-n", "--namespace")}


def configure(parser: argparse.ArgumentParser) -> None:
    from rockbot.kube.client import DEFAULT_REQUEST_TIMEOUT_SECONDS, TIMEOUT_VARIABLE

    parser.epilog = (f"${TIMEOUT_VARIABLE} (default {DEFAULT_REQUEST_TIMEOUT_SECONDS:g}) bounds every Kubernetes "
                     "API request but watches; $KUBECONFIG names the cluster outside one.")
    for name, field in OperatorSettings.model_fields.items():
        parser.add_argument(*_ALIASES.get(name, ()), _flag(name), dest=name, **_argument(name, field))
    parser.add_argument(
        "--liveness",
        metavar="URL",
        default="http://0.0.0.0:8080/healthz",
        help="serve /healthz (liveness) and /readyz (readiness, with what it waits for) on this URL's host and "
        "port (default: %(default)s); 'off' disables them",
    )


def run(args: argparse.Namespace) -> int:
    import uvloop

    from rockbot.kube import KubeConfigError
    from rockbot.logs import setup_logging
    from rockbot.operator.runner import run_operator

    overrides = {name: getattr(args, name) for name in OperatorSettings.model_fields if getattr(args, name) is not None}
    try:
        settings = OperatorSettings(**overrides)
    except pydantic.ValidationError as exc:
        return _fail("; ".join(_explain(error, from_flags=overrides) for error in exc.errors()))
    setup_logging(log_format=settings.log_format, level=logging.INFO)
    liveness = None if args.liveness == "off" else args.liveness
    try:
        # uvloop: a fifth less CPU per API request than asyncio's own loop, the operator's main cost at scale
        # (benchmarks/README.md)
        uvloop.run(run_operator(settings, health_endpoint=liveness))
    except KubeConfigError as exc:
        return _fail(str(exc))
    return 0


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _variable(name: str) -> str:
    return ENV_PREFIX + name.upper()


def _argument(name: str, field: FieldInfo) -> dict[str, typing.Any]:
    """argparse options for one field: values stay strings, so the model validates flags and variables alike."""
    default = field.get_default(call_default_factory=True)
    shown = f"; default: {default}" if default not in (None, [], "") else ""
    options: dict[str, typing.Any] = {"help": f"{field.description or name} (${_variable(name)}{shown})"}
    annotation = field.annotation
    choices = typing.get_args(annotation) if typing.get_origin(annotation) is typing.Literal else ()
    if choices:
        options["choices"] = choices
    elif typing.get_origin(annotation) is list:
        options.update(action="append", metavar=name.upper().rstrip("S"))
        options["help"] += " (repeatable)"
    elif annotation is bool:
        options["action"] = argparse.BooleanOptionalAction
    else:
        options["metavar"] = name.upper()
    return options


def _explain(error: typing.Any, *, from_flags: dict[str, object]) -> str:
    name = str(error["loc"][0]) if error.get("loc") else ""
    if name in from_flags:
        return f"{_flag(name)} {error['input']!r}: {error['msg']}"
    value = os.environ.get(_variable(name), error.get("input"))
    return f"{_variable(name)}={value!r}: {error['msg']}; fix it or unset it"


def _fail(message: str) -> int:
    print(f"rockbot operator: error: {message} (see `rockbot operator --help`)", file=sys.stderr)
    return 2
