"""What a conversation's file under /input adds to a script call (issue 35), on `rockbot local`'s path: the agent's
request names the file by id, the scripts-manager reads it from the console's answerer (`console.file-reads`,
SQLite run store) over the memory bus and the local bubblewrap sandbox puts it under /input.

Calls of one conversation's session (`scriptSessions: PerConversation`: no sandbox start per call), interleaved:
a script that only counts /input's bytes with no file named, and the same with a CSV of --kib KiB named; and the
fetch alone (the manager's reads of that file from the console). p50/p95 of --runs each.

    python -m benchmarks.bench_input_files [--runs 40] [--kib 1024]
"""

from __future__ import annotations

import argparse
import asyncio
import secrets
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from benchmarks.bench_scripts import percentile
from rockbot.bus import CONSOLE, SCRIPTS_MANAGER, MemoryBroker, Principal
from rockbot.bus.topology import SCRIPT_INVOKE
from rockbot.console.file_reads import FileReadAnswerer
from rockbot.console.file_store import FileOwner, FileStore
from rockbot.console.store import Store
from rockbot.contracts.agent_config import ScriptLimits, ScriptSessions
from rockbot.contracts.scripts import SCRIPT_INVOKE_REPLY, InputFiles, ScriptInvokeRequest, ScriptInvokeResponse
from rockbot.scripts_manager.app import ScriptsManager
from rockbot.scripts_manager.input_files import ConsoleInputs
from rockbot.scripts_manager.limits import FixedLimits
from rockbot.scripts_manager.settings import ScriptsManagerSettings
from tests.buses import ALICE, login

SCRIPT = "import os; print(sum(os.path.getsize('/input/' + n) for n in os.listdir('/input')))"


def _row(name: str, samples: list[float]) -> str:
    return f"| {name} | {percentile(samples, 0.5) * 1000:.1f} ms | {percentile(samples, 0.95) * 1000:.1f} ms |"


@dataclass
class Sales:
    """A fresh SQLite run store holding one conversation's sales CSV, and how a script request names it."""

    store: Store
    files: FileStore
    owner: FileOwner
    named: InputFiles
    size: int


async def sales_csv(*, kib: int, prefix: str) -> Sales:
    """`Sales` with a CSV of about `kib` KiB, in a new temporary folder named by `prefix`."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    store = await Store.open(url=f"sqlite:///{folder / 'runs.db'}")
    files = FileStore(store=store)
    owner = FileOwner(namespace=ALICE.namespace, agent=ALICE.name, caller="console:ann", session_id="s1")
    row = b"2026-01-01,1234.56,north,widgets\n"
    csv = b"day,revenue,region,product\n" + row * (kib * 1024 // len(row))
    sales = await files.save(owner=owner, name="sales.csv", content=csv, origin="upload")
    named = InputFiles(caller=owner.caller, session_id=owner.session_id, ids=(sales.id,))
    return Sales(store=store, files=files, owner=owner, named=named, size=len(csv))


async def main(args: argparse.Namespace) -> None:
    sales = await sales_csv(kib=args.kib, prefix="bench-input-files-")
    store, files, named = sales.store, sales.files, sales.named
    broker = MemoryBroker()
    reads = FileReadAnswerer(files=files, bus=await login(broker, CONSOLE))
    await reads.start()
    limits = FixedLimits({ALICE: ScriptLimits(memory="512Mi", sessions=ScriptSessions(mode="PerConversation"))})
    manager = ScriptsManager(settings=ScriptsManagerSettings(scripts_backend="local", health_host="127.0.0.1",
                                                             health_port=0),
                             bus=await login(broker, SCRIPTS_MANAGER), limits=limits)  # fmt: skip
    await manager.start()
    agent = await login(broker, ALICE)
    session = secrets.token_hex(16)

    async def call(input_files: InputFiles | None) -> float:
        request = ScriptInvokeRequest(request_id=secrets.token_hex(8), agent=ALICE.name, script=SCRIPT,
                                      session=session, input_files=input_files)  # fmt: skip
        started = time.perf_counter()
        reply = await agent.request(queue=SCRIPT_INVOKE, body=request, reply_queue=await agent.own_replies(),
                                    correlation_id=request.request_id, timeout_seconds=60,
                                    responder=SCRIPTS_MANAGER)  # fmt: skip
        took = time.perf_counter() - started
        answer = SCRIPT_INVOKE_REPLY.validate_json(reply.body)
        assert isinstance(answer, ScriptInvokeResponse) and answer.exit_code == 0, answer
        assert int(answer.stdout) == (sales.size if input_files else 0), answer.stdout
        return took

    inputs = ConsoleInputs(await login(broker, SCRIPTS_MANAGER))
    try:
        await call(None)  # the session's first call starts its sandbox
        await call(named)
        bare, with_file, fetch = [], [], []
        for _ in range(args.runs):
            bare.append(await call(None))
            with_file.append(await call(named))
            started = time.perf_counter()
            await inputs.fetch(named, agent=Principal.agent(namespace=ALICE.namespace, name=ALICE.name))
            fetch.append(time.perf_counter() - started)
    finally:
        await manager.stop()
        await reads.stop()
        await store.close()
    print(f"| measure ({args.runs} runs, a {sales.size:,}-byte CSV) | p50 | p95 |\n| --- | --- | --- |")
    print(_row("session call, no file named", bare))
    print(_row("session call, the CSV under /input", with_file))
    print(_row("the manager's fetch of the CSV from the console alone", fetch))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--kib", type=int, default=1024)
    asyncio.run(main(parser.parse_args()))
