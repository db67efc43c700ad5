"""`rockbot replay RUN_ID`: run a recorded run's input again against its Agent as it is now, and print both runs
side by side (answer, tool calls and their arguments, tokens, latency).

    rockbot replay 3f2a9c... --url https://console.example.com --token "$TOKEN"          # recorded: no tool runs
    rockbot replay 3f2a9c... --mode live --model gpt-4.1-mini --prompt-file new-prompt.md  # tools really run
    rockbot replay 3f2a9c...                              # rockbot local's run, through its console (127.0.0.1:8080)

The console does it (`POST /api/runs/{id}/replay`, see `console.replay`) as the token's user, who needs to read
the run (`get agents`) and to chat with its Agent (`create agents/chat`). Without a token, the console is taken to
be `rockbot local`'s (the run in its SQLite store, its Agents running), whose one user it asks for its CSRF token.
The exit code is 0 when the replay did the same (answer and tool calls), 3 when it differs, 1 when it could not
replay.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

import aiohttp

from rockbot.console.auth_sessions import CSRF_HEADER
from rockbot.console.replay import CSRF_PATH, Comparison, ReplayOptions, side_by_side

#: `rockbot local`'s console at its default port (`local.console.DEFAULT_PORT`).
LOCAL_CONSOLE = "http://127.0.0.1:8080"
#: The longest a replay may take (the agent's turn and its recording), as the console's chat allows.
TIMEOUT_SECONDS = 960
DIFFERS = 3


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_id", help="the recorded run to replay (rockbot runs list)")
    parser.add_argument("--mode", choices=("recorded", "live"), default="recorded",
                        help="recorded: every tool call matching a recorded one gets its recorded result, no tool "
                        "runs (default); live: tools really run")  # fmt: skip
    parser.add_argument("--model", help="the model to replay with, instead of the Agent's")
    parser.add_argument("--prompt-file", type=Path, help="a system prompt to replay with, instead of the Agent's")
    parser.add_argument("--url", default=os.environ.get("ROCKBOT_CONSOLE_URL", LOCAL_CONSOLE),
                        help=f"the console's address (default: $ROCKBOT_CONSOLE_URL, else rockbot local's, "
                        f"{LOCAL_CONSOLE})")
    parser.add_argument("--token", default=os.environ.get("ROCKBOT_CONSOLE_TOKEN"),
                        help="bearer token for --url (default: $ROCKBOT_CONSOLE_TOKEN)")
    parser.add_argument("--json", action="store_true", help="print the comparison as the API answers it")


def run(args: argparse.Namespace) -> int:
    try:
        prompt = args.prompt_file.read_text() if args.prompt_file else None
        options = ReplayOptions(mode=args.mode, model=args.model, system_prompt=prompt)
        comparison = asyncio.run(replay(url=args.url, token=args.token, run_id=args.run_id, options=options))
    except (RuntimeError, ValueError, OSError, aiohttp.ClientError, TimeoutError) as exc:
        print(f"rockbot replay: {exc}", file=sys.stderr)
        return 1
    print(comparison.model_dump_json(indent=2) if args.json else side_by_side(comparison))
    return DIFFERS if comparison.differences else 0


async def replay(*, url: str, token: str | None, run_id: str, options: ReplayOptions) -> Comparison:
    url = url.rstrip("/")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession(headers=headers, timeout=aiohttp.ClientTimeout(total=TIMEOUT_SECONDS)) as http:
        if not token:
            headers = {CSRF_HEADER: await _local_csrf(http, url)}
        async with http.post(f"{url}/api/runs/{run_id}/replay", json=options.model_dump(exclude_none=True),
                             headers=headers) as response:  # fmt: skip
            text = await response.text()
            if response.status >= 400:
                raise RuntimeError(f"the console answered {response.status}: {text.strip()}")
            return Comparison.model_validate_json(text)


async def _local_csrf(http: aiohttp.ClientSession, url: str) -> str:
    """`rockbot local`'s CSRF token for its one user (no token: the console is taken to be rockbot local's)."""
    try:
        async with http.get(f"{url}{CSRF_PATH}") as response:
            if response.status == 200:
                return str((await response.json())["token"])
    except aiohttp.ClientConnectionError as exc:
        raise RuntimeError(f"no console at {url} ({exc}): start rockbot local, or pass a cluster's --url and --token") \
            from None
    raise RuntimeError(f"{url} is no rockbot local console: pass --token (or $ROCKBOT_CONSOLE_TOKEN) for a cluster's")
