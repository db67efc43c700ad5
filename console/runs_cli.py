"""`rockbot runs list|show|tail|files`: recorded runs, from a cluster's console (its read API) or `rockbot local`'s
SQLite.

    rockbot runs list --url https://console.example.com --token "$TOKEN" -n team-a --agent triage
    rockbot runs show 3f2a9c...                        # rockbot local's runs (~/.local/state/rockbot/runs.db)
    rockbot runs tail -n team-a                        # new runs as they start and end
    rockbot runs files 3f2a9c... --out charts/         # the files the run brought, saved into charts/

`files --out DIR` writes each file under the last part of its name only (`charts/a.png` becomes `DIR/a.png`; a
name taken already gets `-2`, `-3`...), never over an existing file and never through a link: a name a script
chose is never a path.

With `--url` (or `$ROCKBOT_CONSOLE_URL`) the runs come from the console over HTTP, as the token's
user may read them (`--token` or `$ROCKBOT_CONSOLE_TOKEN`: a ServiceAccount or user token); without,
from the SQLite file `--database` names. `--json` prints what the API answers.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Protocol

import aiohttp
from pydantic import TypeAdapter

from rockbot.console.settings import DEFAULT_DATABASE
from rockbot.console.store_models import RunDetail, RunFilter, RunPage, RunSummary, StoredFile

TAIL_SECONDS = 2.0
_FILES: TypeAdapter[dict[str, list[StoredFile]]] = TypeAdapter(dict[str, list[StoredFile]])


class RunSource(Protocol):
    async def list_runs(self, *, filters: RunFilter, limit: int, cursor: str | None = None) -> RunPage: ...

    async def get_run(self, run_id: str) -> RunDetail | None: ...

    async def close(self) -> None: ...


class HttpRuns:
    """The console's read API (`console.api`) as a user with a bearer token reads it."""

    def __init__(self, *, url: str, token: str | None) -> None:
        self._url = url.rstrip("/")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = aiohttp.ClientSession(headers=headers, timeout=aiohttp.ClientTimeout(total=30))

    async def _get(self, path: str, params: dict[str, str]) -> str | None:
        async with self._http.get(f"{self._url}{path}", params=params) as response:
            text = await response.text()
            if response.status == 404:
                return None
            if response.status >= 400:
                raise RuntimeError(f"the console answered {response.status}: {text.strip()}")
            return text

    async def list_runs(self, *, filters: RunFilter, limit: int, cursor: str | None = None) -> RunPage:
        params = {k: v.isoformat() if isinstance(v, datetime.datetime) else str(v)
                  for k, v in filters.model_dump(exclude_none=True).items()}  # fmt: skip
        if "session_id" in params:
            params["session"] = params.pop("session_id")
        params["limit"] = str(limit)
        if cursor:
            params["cursor"] = cursor
        text = await self._get("/api/runs", params)
        if text is None:
            raise RuntimeError(f"{self._url} serves no run API (/api/runs): is it the console's address?")
        return RunPage.model_validate_json(text)

    async def get_run(self, run_id: str) -> RunDetail | None:
        text = await self._get(f"/api/runs/{run_id}", {})
        return None if text is None else RunDetail.model_validate_json(text)

    async def run_files(self, run_id: str) -> list[StoredFile] | None:
        text = await self._get(f"/api/runs/{run_id}/files", {})
        return None if text is None else _FILES.validate_json(text)["files"]

    async def file_content(self, file_id: str) -> bytes:
        async with self._http.get(f"{self._url}/api/files/{file_id}") as response:
            if response.status >= 400:
                raise RuntimeError(f"the console answered {response.status} for file {file_id}")
            return await response.read()

    async def close(self) -> None:
        await self._http.close()


def configure_source(parser: argparse.ArgumentParser) -> None:
    """Where runs are read: `--url` and `--token` (a console), else `--database` (`open_runs`)."""
    parser.add_argument("--url", default=os.environ.get("ROCKBOT_CONSOLE_URL"),
                        help="the console's address (default: $ROCKBOT_CONSOLE_URL; none: the local SQLite runs)")
    parser.add_argument("--token", default=os.environ.get("ROCKBOT_CONSOLE_TOKEN"),
                        help="bearer token for --url (default: $ROCKBOT_CONSOLE_TOKEN)")
    parser.add_argument("--database", default=str(DEFAULT_DATABASE),
                        help=f"the SQLite run store without --url (default: {DEFAULT_DATABASE})")


def configure(parser: argparse.ArgumentParser) -> None:
    configure_source(parser)
    parser.add_argument("--json", action="store_true", help="print JSON as the API answers it")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB", required=True)
    for verb, help_text in (("list", "list runs, newest first"), ("tail", "print runs as they start and end")):
        sub = verbs.add_parser(verb, help=help_text)
        sub.add_argument("-n", "--namespace", help="the runs of this namespace (required with --url)")
        sub.add_argument("--agent")
        sub.add_argument("--source", help="chat, http, a2a, user_message, scheduled_task, trigger, agent_call, local, "
                         "replay, evaluation")
        sub.add_argument("--outcome", help="Succeeded, Failed, Refused, TimedOut, Interrupted")
        sub.add_argument("--session")
        sub.add_argument("--since", help="ISO 8601 time, e.g. 2026-11-25T17:00:00Z")
        sub.add_argument("--limit", type=int, default=20)
    show = verbs.add_parser("show", help="one run with its timeline")
    show.add_argument("run_id")
    files = verbs.add_parser("files", help="the files a run brought (a person's attachments, its scripts' files)")
    files.add_argument("run_id")
    files.add_argument("--out", help="save them into this folder (made if missing)")


def run(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(_main(args))
    except (RuntimeError, ValueError, OSError, aiohttp.ClientError) as exc:
        print(f"rockbot runs: {exc}", file=sys.stderr)
        return 1


async def open_runs(args: argparse.Namespace) -> RunSource:
    """The runs `--url` (the console, as `--token`'s user) or `--database` (a local SQLite store) names."""
    if args.url:
        return HttpRuns(url=args.url, token=args.token)
    from rockbot.console.store import Store

    if not await asyncio.to_thread(os.path.exists, args.database):
        raise RuntimeError(f"no run store at {args.database}: pass --url for a cluster's console, or --database")
    return await Store.open(url=f"sqlite:///{args.database}", migrate=False)


async def _main(args: argparse.Namespace) -> int:
    source = await open_runs(args)
    try:
        if args.verb == "files":
            return await _files(source, run_id=args.run_id, out=args.out, as_json=args.json)
        if args.verb == "show":
            run = await source.get_run(args.run_id)
            if run is None:
                print(f"rockbot runs: no run {args.run_id!r}", file=sys.stderr)
                return 1
            if args.json:
                print(run.model_dump_json(indent=2))
                return 0
            print(describe(run))
            files, _ = await _run_files(source, args.run_id)
            if files:  # what the run brought: `rockbot runs files RUN --out DIR` saves them
                print(f"\nfiles (rockbot runs files {args.run_id} --out DIR saves them):\n{_listed(files)}")
            return 0
        filters = RunFilter(
            namespace=args.namespace, agent=args.agent, source=args.source, outcome=args.outcome,
            session_id=args.session, since=datetime.datetime.fromisoformat(args.since) if args.since else None,
        )  # fmt: skip
        if args.verb == "list":
            page = await source.list_runs(filters=filters, limit=args.limit)
            print(page.model_dump_json(indent=2) if args.json else table(page.runs))
            return 0
        await _tail(source, filters=filters, limit=args.limit, as_json=args.json)
        return 0
    finally:
        await source.close()


async def _run_files(source: RunSource, run_id: str
                     ) -> tuple[list[StoredFile] | None, Callable[[str], Awaitable[bytes]]]:  # fmt: skip
    """The run's files (None: no such run) and how to fetch one's bytes, from the console or the local store."""
    if isinstance(source, HttpRuns):
        return await source.run_files(run_id), source.file_content
    from rockbot.console.file_store import FileStore

    kept = FileStore(store=source)  # type: ignore[arg-type]
    files = None if await source.get_run(run_id) is None else await kept.of_run(run_id)

    async def fetch(file_id: str) -> bytes:
        found = await kept.read_any(file_id)
        if found is None:
            raise RuntimeError(f"file {file_id} is gone")
        return found[1]

    return files, fetch


def _listed(files: list[StoredFile]) -> str:
    return "\n".join(f"{file.id}  {file.size:>10,}  {file.media_type:28} {file.name}" for file in files)


async def _files(source: RunSource, *, run_id: str, out: str | None, as_json: bool) -> int:
    files, fetch = await _run_files(source, run_id)
    if files is None:
        print(f"rockbot runs: no run {run_id!r}", file=sys.stderr)
        return 1
    if as_json:
        print(_FILES.dump_json({"files": files}, indent=2).decode())
    elif files:
        print(_listed(files))
    if out is not None:
        folder = Path(out)
        await asyncio.to_thread(folder.mkdir, parents=True, exist_ok=True)
        for file in files:
            path = await asyncio.to_thread(_save, folder, file.name.rpartition("/")[2], await fetch(file.id))
            print(f"saved {path}", file=sys.stderr)
    return 0


def _save(folder: Path, name: str, content: bytes) -> Path:
    """`content` as a new file in `folder` named `name` (or `name-2`, `-3`...), never through a link."""
    stem, dot, suffix = name.rpartition(".") if "." in name.lstrip(".") else (name, "", "")
    for attempt in range(1, 1000):
        candidate = name if attempt == 1 else f"{stem}-{attempt}{dot}{suffix}"
        try:
            fd = os.open(folder / candidate, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except FileExistsError:
            continue
        with os.fdopen(fd, "wb") as target:
            target.write(content)
        return folder / candidate
    raise RuntimeError(f"{folder} already holds 999 files named like {name}")


async def _tail(source: RunSource, *, filters: RunFilter, limit: int, as_json: bool) -> None:
    """Print the newest runs, then each run again whenever it is new or has ended, until interrupted."""
    seen: dict[str, str | None] = {}
    first = True
    while True:
        page = await source.list_runs(filters=filters, limit=limit)
        changed = [run for run in reversed(page.runs) if seen.get(run.run_id, "?") != run.outcome]
        for run in changed:
            seen[run.run_id] = run.outcome
        if changed:
            print("\n".join(run.model_dump_json() for run in changed) if as_json
                  else table(changed, header=first), flush=True)  # fmt: skip
            first = False
        await asyncio.sleep(TAIL_SECONDS)


def table(runs: list[RunSummary], *, header: bool = True) -> str:
    columns = f"{'STARTED':20} {'AGENT':28} {'SOURCE':14} {'OUTCOME':11} {'TOOLS':>5} {'TOKENS':>7}  RUN"
    lines = [columns] if header else []
    for run in runs:
        lines.append(
            f"{run.started_at:%Y-%m-%d %H:%M:%S}  {run.namespace + '/' + run.agent:28} {run.source:14} "
            f"{run.outcome or 'running':11} {run.tool_calls:>5} {run.prompt_tokens + run.completion_tokens:>7}  "
            f"{run.run_id}"
        )
    return "\n".join(lines)


def describe(run: RunDetail) -> str:
    """A run as a person reads it: what it was, then its timeline, one line per entry (long text cut)."""
    ended = f"{run.ended_at:%H:%M:%S}" if run.ended_at else "-"
    lines = [
        f"run       {run.run_id}",
        f"agent     {run.namespace}/{run.agent}  (source {run.source}, caller {run.caller or '-'}, "
        f"session {run.session_id or '-'})",
        f"time      {run.started_at:%Y-%m-%d %H:%M:%S} .. {ended}  outcome {run.outcome or 'running'}"
        + (f"  error: {run.error}" if run.error else ""),
        f"model     {run.model or '-'}  tokens {run.prompt_tokens} in / {run.completion_tokens} out, "
        f"{run.tool_calls} tool calls, recorded {run.record}",
    ]
    if run.parent_run_id:
        lines.append(f"parent    {run.parent_run_id}")
    if run.children:
        lines.append(f"children  {', '.join(run.children)}")
    lines.append("timeline")
    for entry in run.timeline:
        at = f"{entry.at:%H:%M:%S.%f}"[:-3]
        lines.append(f"  {at}  {_entry_line(entry.kind, entry.name, entry.status, entry.data)}")
    if run.timeline_omitted:
        lines.append(f"  ... {run.timeline_omitted} more entries not shown")
    return "\n".join(lines)


def _short(text: object, limit: int = 160) -> str:
    flat = " ".join(str(text or "").split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def _entry_line(kind: str, name: str, status: str, data: dict[str, object]) -> str:
    if kind == "message":
        calls = data.get("tool_calls") or []
        said = _short(data.get("content")) or (f"(calls {len(calls)} tools)" if calls else "")  # type: ignore[arg-type]
        return f"{name:9} {said}"
    if kind == "model_request":
        return (f"model     {name} {status} {data.get('prompt_tokens')}+{data.get('completion_tokens')} tokens "
                f"{data.get('latency_seconds', 0):.2f}s {data.get('finish_reason') or ''}")  # fmt: skip
    if kind == "tool_call":
        outcome = "ok" if status == "ok" else f"error {status}"
        return (f"tool      {name}({_short(data.get('arguments'), 80)}) -> {outcome} "
                f"{data.get('duration_seconds', 0):.2f}s: {_short(data.get('result'), 100)}")  # fmt: skip
    if kind == "script_run":
        return (f"script    exit {status or '?'} on {name or '?'} {data.get('pod') or ''} "
                f"{data.get('duration_seconds', 0):.2f}s stdout: {_short(data.get('stdout'), 100)}"
                + (f" stderr: {_short(data.get('stderr'), 100)}" if data.get("stderr") else ""))  # fmt: skip
    return f"{kind} {name} {status}"
