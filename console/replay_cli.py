"""`rockbot replay RUN_ID`: run a recorded run's input again against its Agent as it is now, and print both runs
side by side (answer, tool calls and their arguments, tokens, latency).

    rockbot replay 3f2a9c... --url https://console.example.com --token "$TOKEN"          # recorded: no tool runs
    rockbot replay 3f2a9c... --mode live --model gpt-4.1-mini --prompt-file new-prompt.md  # tools really run

The console does it (`POST /api/runs/{id}/replay`, see `console.replay`) as the token's user, who needs to read
the run (`get agents`) and to chat with its Agent (`create agents/chat`). The exit code is 0 when the replay did
the same (answer and tool calls), 3 when it differs, 1 when it could not replay.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

import aiohttp

from rockbot.console.replay import Comparison, ReplayOptions, side_by_side

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
    parser.add_argument("--url", default=os.environ.get("ROCKBOT_CONSOLE_URL"),
                        help="the console's address (default: $ROCKBOT_CONSOLE_URL)")
    parser.add_argument("--token", default=os.environ.get("ROCKBOT_CONSOLE_TOKEN"),
                        help="bearer token for --url (default: $ROCKBOT_CONSOLE_TOKEN)")
    parser.add_argument("--json", action="store_true", help="print the comparison as the API answers it")


def run(args: argparse.Namespace) -> int:
    try:
        if not args.url:
            raise ValueError("--url: name the console that recorded the run (or set $ROCKBOT_CONSOLE_URL)")
        prompt = args.prompt_file.read_text() if args.prompt_file else None
        options = ReplayOptions(mode=args.mode, model=args.model, system_prompt=prompt)
        comparison = asyncio.run(replay(url=args.url, token=args.token, run_id=args.run_id, options=options))
    except (RuntimeError, ValueError, OSError, aiohttp.ClientError, TimeoutError) as exc:
        print(f"rockbot replay: {exc}", file=sys.stderr)
        return 1
    print(comparison.model_dump_json(indent=2) if args.json else side_by_side(comparison))
    return DIFFERS if comparison.differences else 0


async def replay(*, url: str, token: str | None, run_id: str, options: ReplayOptions) -> Comparison:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    timeout = aiohttp.ClientTimeout(total=TIMEOUT_SECONDS)
    async with (aiohttp.ClientSession(headers=headers, timeout=timeout) as http,
                http.post(f"{url.rstrip('/')}/api/runs/{run_id}/replay",
                          json=options.model_dump(exclude_none=True)) as response):  # fmt: skip
        text = await response.text()
        if response.status >= 400:
            raise RuntimeError(f"the console answered {response.status}: {text.strip()}")
        return Comparison.model_validate_json(text)
