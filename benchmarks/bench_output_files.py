"""What a script's files under /output cost a call on `rockbot local`'s path (issue 35): a 200 KB PNG carried in the
script's answer and kept by the agent (`console.files`), against the same PNG kept by the scripts-manager itself a
chunk at a time (`console.file-writes`); a 1 MiB CSV in with the PNG out; and a 10 MiB file and a call's 50 MiB
out, which only the manager's path carries.

The memory bus, the console's file answerers on a SQLite run store and the local bubblewrap sandbox, all in this
process, calls of one conversation's session (no sandbox start per call), the cases interleaved in a rotating
order. A call is timed as the agent's tool sees it: the script's answer and the keeping of its files (the agent's
`keep_artifacts`). CPU is this process's (the scripts-manager, the console's answerers and the agent's client; not
the sandbox) across a call. p50/p95 of --runs each.

    python -m benchmarks.bench_output_files [--runs 30]
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import secrets
import time
from types import SimpleNamespace

from benchmarks.bench_input_files import sales_csv
from benchmarks.bench_scripts import percentile
from rockbot.agent.file_keeping import BusFileKeeper, keep_artifacts
from rockbot.bus import CONSOLE, SCRIPTS_MANAGER, MemoryBroker
from rockbot.bus.topology import SCRIPT_INVOKE
from rockbot.console.file_reads import FileReadAnswerer
from rockbot.console.file_writes import FileWriteAnswerer
from rockbot.console.files import FileAnswerer
from rockbot.contracts.agent_config import ScriptLimits, ScriptSessions
from rockbot.contracts.recording import new_run_id
from rockbot.contracts.scripts import (
    SCRIPT_INVOKE_REPLY,
    InputFiles,
    OutputFiles,
    ScriptInvokeRequest,
    ScriptInvokeResponse,
)
from rockbot.scripts_manager.app import ScriptsManager
from rockbot.scripts_manager.limits import FixedLimits
from rockbot.scripts_manager.output_files import ConsoleOutputs
from rockbot.scripts_manager.settings import ScriptsManagerSettings
from tests.buses import ALICE, login

BARE = "print(1)"
PNG = "import os; open('/output/chart.png', 'wb').write(b'\\x89PNG\\r\\n\\x1a\\n' + os.urandom(200_000))"
BOTH = "n = len(open('/input/sales.csv', 'rb').read()); " + PNG
LARGE = "import os; open('/output/large.bin', 'wb').write(os.urandom(10 * 1024 * 1024))"
BOUND = "import os\nfor n in range(5): open(f'/output/{n}.bin', 'wb').write(os.urandom(10 * 1024 * 1024))"


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _row(name: str, took: list[float], cpu: list[float], base: float) -> str:
    p50 = percentile(took, 0.5)
    added = f"+{(p50 - base) * 1000:.1f} ms" if base else ""
    return (f"| {name} | {p50 * 1000:.1f} ms | {percentile(took, 0.95) * 1000:.1f} ms | {added} | "
            f"{percentile(cpu, 0.5) * 1000:.1f} ms |")  # fmt: skip


async def main(args: argparse.Namespace) -> None:
    sales = await sales_csv(kib=1024, prefix="bench-output-files-")
    store, files, owner, named = sales.store, sales.files, sales.owner, sales.named
    broker = MemoryBroker()
    console = await login(broker, CONSOLE)
    answerers = [FileReadAnswerer(files=files, bus=console), FileWriteAnswerer(files=files, bus=console),
                 FileAnswerer(files=files, bus=console)]  # fmt: skip
    for answerer in answerers:
        await answerer.start()
    limits = FixedLimits({ALICE: ScriptLimits(memory="512Mi", sessions=ScriptSessions(mode="PerConversation"))})
    settings = ScriptsManagerSettings(scripts_backend="local", health_host="127.0.0.1", health_port=0)
    manager_bus = await login(broker, SCRIPTS_MANAGER)
    manager = ScriptsManager(settings=settings, bus=manager_bus, limits=limits)
    await manager.start()
    # The manager's own choice (files that fit travel in the answer), and one that keeps every file itself.
    inline = ConsoleOutputs(manager_bus, inline_bytes=settings.output_bounds.total_bytes)
    kept = ConsoleOutputs(manager_bus, inline_bytes=0)
    agent = await login(broker, ALICE)
    keeper = BusFileKeeper(bus=agent)
    session = secrets.token_hex(16)
    run_id = new_run_id(namespace=ALICE.namespace, agent=ALICE.name)
    run = SimpleNamespace(run_id=run_id, caller=owner.caller, session_id=owner.session_id,
                          recorder=SimpleNamespace(record="Full", retention_days=30))  # fmt: skip
    target = OutputFiles(run_id=run_id, caller=owner.caller, session_id=owner.session_id)

    async def call(script: str, *, outputs: ConsoleOutputs, input_files: InputFiles | None = None
                   ) -> tuple[float, float]:  # fmt: skip
        manager._service._outputs = outputs  # type: ignore[union-attr]  # the case's choice (a benchmark's reach)
        request = ScriptInvokeRequest(request_id=secrets.token_hex(8), agent=ALICE.name, script=script,
                                      session=session, input_files=input_files, output_files=target)  # fmt: skip
        started, cpu = time.perf_counter(), _cpu()
        reply = await agent.request(queue=SCRIPT_INVOKE, body=request, reply_queue=await agent.own_replies(),
                                    correlation_id=request.request_id, timeout_seconds=60,
                                    responder=SCRIPTS_MANAGER)  # fmt: skip
        answer = SCRIPT_INVOKE_REPLY.validate_json(reply.body)
        assert isinstance(answer, ScriptInvokeResponse) and answer.exit_code == 0, answer
        answer = await keep_artifacts(answer, run=run, keeper=keeper)  # type: ignore[arg-type]
        took, used = time.perf_counter() - started, _cpu() - cpu
        assert not answer.artifacts_dropped, answer.artifacts_dropped
        return took, used

    cases = {
        "`print(1)`": (BARE, inline, None),
        "200 KB PNG out, in the answer (kept by the agent)": (PNG, inline, None),
        "200 KB PNG out, kept by the manager": (PNG, kept, None),
        "1 MiB CSV in + 200 KB PNG out (in the answer)": (BOTH, inline, named),
        "10 MiB file out, kept by the manager (3 chunks)": (LARGE, inline, None),
        "50 MiB out (5 files of 10 MiB), kept by the manager": (BOUND, inline, None),
    }
    samples: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in cases}
    try:
        for script, outputs, input_files in cases.values():
            await call(script, outputs=outputs, input_files=input_files)  # the session's start, and a warm-up
        names = list(cases)
        for turn in range(args.runs):
            for name in names[turn % len(names):] + names[:turn % len(names)]:  # each case after each other in turn
                script, outputs, input_files = cases[name]
                took, used = await call(script, outputs=outputs, input_files=input_files)
                samples[name][0].append(took)
                samples[name][1].append(used)
    finally:
        await manager.stop()
        for answerer in answerers:
            await answerer.stop()
        await store.close()
    base = percentile(samples["`print(1)`"][0], 0.5)
    print(f"| case ({args.runs} runs each) | p50 | p95 | added at p50 | CPU in process p50 |")
    print("| --- | --- | --- | --- | --- |")
    for name, (took, cpu) in samples.items():
        print(_row(name, took, cpu, 0.0 if name == "`print(1)`" else base))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    asyncio.run(main(parser.parse_args()))
