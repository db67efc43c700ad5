"""Files in and out of script pods on the real node: what a 1 MiB CSV under /input and a 200 KB PNG under /output add
to a warm call, and the scripts-manager's CPU for moving them.

The real pod backend runs in this process against the rig of ../shared/k8s, as bench_pods.py runs it (a namespace of
its own with Pod Security `restricted`, a warm pool of one limits class), one request at a time with the pool
refilled between requests ("warm, sequential"). Cases: `print(1)`; a 1 MiB CSV in (the script reads its size); a
200 KB PNG out (the script writes it, the manager reads it back, checks and describes it); both. The scripts-manager
fetches input files from the console before the backend runs (not measured here: bench_console's file reads).

CPU: this process's CPU time across each request (`time.process_time`): the backend runs here, so it is the
manager's CPU for the call, the pool's replacement pod included; what moving the files costs is the difference to
`print(1)`'s. Needs the rig up and the script image on the node.

    python -m benchmarks.bench_pod_files [--runs 20] [--pool 3] [--cpu 250m] [--memory 128Mi]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from benchmarks.bench_pods import idle, pod_backend, scripts_namespace
from benchmarks.bench_scripts import percentile
from rockbot.scripts_manager.backends import InputFile, ScriptJob

CSV = b"month,revenue\n" + b"".join(b"2026-%02d,%09d\n" % (n % 12 + 1, n) for n in range(58_254))  # 1 MiB
PNG_BYTES = 200 * 1024
READ = "import os\nprint(os.path.getsize('/input/sales.csv'))\n"
WRITE = (f"import os\nopen('/output/chart.png', 'wb').write(bytes.fromhex('89504e470d0a1a0a') + "
         f"os.urandom({PNG_BYTES - 8}))\nprint(1)\n")
CASES = {
    "print(1)": ("print(1)", ()),
    "1 MiB CSV in": (READ, (InputFile(name="sales.csv", content=CSV),)),
    "200 KB PNG out": (WRITE, ()),
    "both": (READ + WRITE, (InputFile(name="sales.csv", content=CSV),)),
}


async def measure(*, namespace: str, pool: int, runs: int, cpu: str, memory: str) -> dict[str, tuple[list, list]]:
    """Per case: request-to-answer seconds and this process's CPU-seconds of each request (the cases interleaved, so
    that the node's load drifts alike for all)."""
    backend = await pod_backend(namespace=namespace, pool=pool, cpu=cpu, memory=memory)
    await backend.start()
    figures: dict[str, tuple[list, list]] = {label: ([], []) for label in CASES}
    try:
        for number in range(runs):
            for label, (script, files) in CASES.items():
                await idle(backend, pool)
                job = ScriptJob(request_id=f"bench-{number}-{len(figures[label][0])}-{label}", script=script,
                                input_data=None, timeout_seconds=10, files=files)  # fmt: skip
                cpu_before, started = time.process_time(), time.perf_counter()
                result = await backend.run(job)
                figures[label][0].append(time.perf_counter() - started)
                figures[label][1].append(time.process_time() - cpu_before)
                assert result.exit_code == 0, result
                assert len(result.artifacts) == script.count("/output"), result
    finally:
        await backend.close()
    return figures


async def main(*, runs: int, pool: int, cpu: str, memory: str) -> None:
    async with scripts_namespace() as (kube, namespace):
        print(f"files in and out of warm script pods on the real node ({kube.host}), class {cpu}/{memory}, "
              f"pool {pool}, {runs} runs a case, interleaved:", flush=True)
        figures = await measure(namespace=namespace, pool=pool, runs=runs, cpu=cpu, memory=memory)
    base, base_cpu = statistics.median(figures["print(1)"][0]), statistics.median(figures["print(1)"][1])
    for label, (seconds, cpus) in figures.items():
        p50, p95, cpu_ms = statistics.median(seconds), percentile(seconds, 0.95), statistics.median(cpus) * 1000
        print(f"  {label:16} p50 {p50 * 1000:6.1f} ms  p95 {p95 * 1000:6.1f} ms  (+{(p50 - base) * 1000:5.1f} ms at "
              f"p50)   manager CPU p50 {cpu_ms:5.1f} ms (+{cpu_ms - base_cpu * 1000:4.1f} ms)", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--pool", type=int, default=3, help="idle pods of the class kept warm")
    parser.add_argument("--cpu", default="250m", help="the script pods' CPU (requests = limits)")
    parser.add_argument("--memory", default="128Mi")
    arguments = parser.parse_args()
    asyncio.run(main(runs=arguments.runs, pool=arguments.pool, cpu=arguments.cpu, memory=arguments.memory))
