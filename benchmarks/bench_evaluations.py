"""The platform's own cost per Evaluation case (issue 33): CPU and run-store writes, printed.

    PYTHONSAFEPATH=1 python benchmarks/bench_evaluations.py [--cases 100] [--concurrency 4]

`rockbot eval run` in this process (rockbot local: its in-memory bus, the agent's turn, its recording into a fresh
SQLite run store, the runner's checks), against the scripted model as its own process answering one text turn at
once. Every statement that reaches the store is counted (SQLAlchemy's `after_cursor_execute` on every engine):
writes (INSERT, UPDATE, DELETE) and the rows they changed. One Evaluation of 1 case, then one of `--cases`; the
difference over `--cases - 1` is the cost of one more case, start-up (opening the store, the sandbox's isolation
canary) left out; a first 1-case run, not counted, takes the imports. The model's own time is not the platform's:
it answers at once here.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rockbot.cli import main as rockbot  # noqa: E402

WRITES = ("INSERT", "UPDATE", "DELETE")
AGENT = """apiVersion: rockbot.dev/v1alpha1
kind: Agent
metadata: {name: echo}
spec:
  model: {baseUrl: http://127.0.0.1:1/v1, name: scripted-model}
  systemPrompt: Answer briefly.
"""


class Counted:
    """Store statements by verb, and the rows the writes changed."""

    def __init__(self) -> None:
        self.statements: collections.Counter[str] = collections.Counter()
        self.rows = 0
        #: Rows written by table ("INSERT runs", "UPDATE runs", ...).
        self.tables: collections.Counter[str] = collections.Counter()
        event.listen(Engine, "after_cursor_execute", self._seen)

    def _seen(self, conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, many: bool) -> None:
        verb = statement.lstrip().split(None, 1)[0].upper() if statement.strip() else ""
        self.statements[verb] += 1
        if verb in WRITES and cursor.rowcount and cursor.rowcount > 0:
            self.rows += cursor.rowcount
            words = statement.split()
            self.tables[f"{verb} {words[2] if verb in ('INSERT', 'DELETE') else words[1]}"] += cursor.rowcount

    def snapshot(self) -> tuple[int, int, int]:
        """(write statements, rows written, all statements)."""
        return sum(self.statements[v] for v in WRITES), self.rows, sum(self.statements.values())


def evaluation(cases: int, concurrency: int) -> str:
    body = {"apiVersion": "rockbot.dev/v1alpha1", "kind": "Evaluation", "metadata": {"name": f"bench-{cases}"},
            "spec": {"agentRef": {"name": "echo"}, "concurrency": concurrency,
                     "cases": [{"name": f"case-{n}", "input": f"Say hello {n}.",
                                "expect": {"contains": ["hello"], "maxToolCalls": 0}}
                               for n in range(cases)]}}  # fmt: skip
    return json.dumps(body)


def one(cases: int, concurrency: int, counted: Counted, folder: Path) -> tuple[float, float, tuple[int, int, int]]:
    """(wall s, CPU s, store counts) of `rockbot eval run` over an Evaluation of `cases` cases."""
    work = folder / f"run-{cases}"
    work.mkdir(parents=True)
    (work / "agent.yaml").write_text(AGENT)
    (work / "evaluation.yaml").write_text(evaluation(cases, concurrency))
    os.environ["XDG_STATE_HOME"] = str(work / "state")
    before, cpu, wall = counted.snapshot(), _cpu(), time.perf_counter()
    with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
        code = rockbot(["eval", "run", str(work)])
    wall, cpu, after = time.perf_counter() - wall, _cpu() - cpu, counted.snapshot()
    if code != 0:
        raise SystemExit(f"rockbot eval run exited {code} for {cases} cases")
    return wall, cpu, (after[0] - before[0], after[1] - before[1], after[2] - before[2])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", type=int, default=100)
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder, _model(Path(folder)) as url:
        os.environ.update({"OPENAI_BASE_URL": url, "OPENAI_API_KEY": "sk-bench", "OPENAI_MODEL": "scripted-model"})
        counted = Counted()
        one(1, args.concurrency, counted, Path(folder) / "warm-up")  # imports and first-time set-up, not counted
        small = one(1, args.concurrency, counted, Path(folder))
        large = one(args.cases, args.concurrency, counted, Path(folder))
    extra = args.cases - 1
    print(f"\n1 case: wall {small[0]:.2f} s, CPU {small[1]:.2f} s, store: {small[2][0]} writes "
          f"({small[2][1]} rows) of {small[2][2]} statements")  # fmt: skip
    print(f"{args.cases} cases, {args.concurrency} at once: wall {large[0]:.2f} s, CPU {large[1]:.2f} s, store: "
          f"{large[2][0]} writes ({large[2][1]} rows) of {large[2][2]} statements")  # fmt: skip
    print(f"per case beyond start-up: CPU {(large[1] - small[1]) / extra * 1000:.1f} ms, "
          f"{(large[2][0] - small[2][0]) / extra:.1f} write statements, {(large[2][1] - small[2][1]) / extra:.1f} "
          f"rows written, {(large[2][2] - small[2][2]) / extra:.1f} statements in all")  # fmt: skip
    print("rows written in all, by table:", dict(counted.tables))


class _model:
    """The scripted model as its own process, answering every request with one text turn."""

    def __init__(self, folder: Path) -> None:
        self._script = folder / "turns.json"
        self._script.write_text(json.dumps([{"text": "hello there"}]))
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self._port = probe.getsockname()[1]
        self._process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> str:
        self._process = subprocess.Popen([sys.executable, "-m", "tests.fixtures.llm", "--script", str(self._script),
                                          "--port", str(self._port), "--loop"],
                                         env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", self._port), timeout=1).close()
                return f"http://127.0.0.1:{self._port}/v1"
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def __exit__(self, *_: object) -> None:
        assert self._process is not None
        self._process.terminate()
        self._process.wait(timeout=10)


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


if __name__ == "__main__":
    main()
