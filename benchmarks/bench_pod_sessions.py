"""Script sessions on the real node: the pod backend's PerConversation calls against the rig of ../shared/k8s.

The real pod backend runs in this process with the rig's admin kubeconfig, in a namespace of its own named
`*-scripts` with Pod Security `restricted` (as bench_pods.py). Figures are request to answer as the
scripts-manager sees it (the bus round trip to an agent adds ~2 ms, see bench_scripts.py):

- a session's first call: a new conversation each time, on a warm pod (the pool let refill between calls):
  the claim, the runner becoming the kernel, the call;
- a session's later call: `x += 1` in one conversation's kept interpreter, one after another (the call's mark
  on the pod, one line on the open attach session, the answer);
- a session's later call with files (bench_pod_files.py's): a new version of a 1 MiB CSV each call (sent after
  the call's line, written under /input by the kernel) read, and a 200 KB PNG written under /output (read by the
  kernel with the shared walk, base64 after the call's marker, checked by the manager), interleaved with the
  plain later call in the same session, so the difference is what moving the files costs.

It prints the p50 and p95 of each, and where the first calls' time went (the backend's span events, as
bench_pods.py prints them). Needs the rig up (`$K8SREAL/up.sh && $K8SREAL/node-up.sh`, or scripts/e2e-real).

    python -m benchmarks.bench_pod_sessions [--runs 50] [--firsts 10] [--cpu 250m] [--memory 128Mi] [--no-files]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from opentelemetry import trace

from benchmarks.bench_pod_files import CSV, READ, WRITE
from benchmarks.bench_pods import REQUEST, idle, pod_backend, report, scripts_namespace, trace_to_spans
from rockbot.scripts_manager.backends import InputFile, ScriptJob, SessionTerms
from rockbot.scripts_manager.backends.pods import PodBackend

tracer = trace.get_tracer(__name__)


def terms(conversation: str) -> SessionTerms:
    return SessionTerms(owner="agent.bench.analyst", session=conversation.ljust(32, "0"), idle_seconds=300,
                        max_seconds=3000)  # fmt: skip


async def timed(backend: PodBackend, job: ScriptJob, samples: list[float], *, span: str = REQUEST,
                cpu: list[float] | None = None) -> str:
    """Run `job`, its time into `samples` (and this process's CPU time, the manager's, into `cpu`); `span` other
    than REQUEST keeps its steps out of the breakdown printed."""
    with tracer.start_as_current_span(span):
        started, spent = time.perf_counter(), time.process_time()
        result = await backend.run(job)
        samples.append(time.perf_counter() - started)
        if cpu is not None:
            cpu.append(time.process_time() - spent)
    assert result.exit_code == 0, result
    return f"{result.session}:{result.stdout.strip()}"


async def main(*, runs: int, firsts: int, cpu: str, memory: str, files: bool) -> None:
    trace_to_spans()
    async with scripts_namespace() as (kube, namespace):
        backend = await pod_backend(namespace=namespace, pool=2, cpu=cpu, memory=memory)
        await backend.start()
        try:
            print(f"script sessions on the real node ({kube.host}), namespace {namespace}, class {cpu}/{memory}, "
                  f"pool 2:", flush=True)
            first: list[float] = []
            for number in range(firsts):
                await idle(backend, 2)
                said = await timed(backend, ScriptJob(
                    request_id=f"first-{number}", script="x = 0\nprint(x)", input_data=None, timeout_seconds=10,
                    session=terms(f"first{number}"),
                ), first)  # fmt: skip
                assert said == "new:0", said
            report("first call (warm pod)", first, 0)
            await idle(backend, 2)
            later: list[float] = []
            conversation = terms("later")
            await backend.run(ScriptJob(request_id="later-0", script="x = 0", input_data=None, timeout_seconds=10,
                                        session=conversation))  # fmt: skip
            moved: list[float] = []
            cpu: dict[str, list[float]] = {"later": [], "files": []}
            for number in range(1, runs + 1):
                said = await timed(backend, ScriptJob(
                    request_id=f"later-{number}", script="x += 1\nprint(x)", input_data=None, timeout_seconds=10,
                    session=conversation,
                ), later, cpu=cpu["later"])  # fmt: skip
                assert said == f"kept:{number}", said
                if files:
                    csv = InputFile(name="sales.csv", content=CSV + b"2026-12,%09d\n" % number)  # a new version
                    said = await timed(backend, ScriptJob(
                        request_id=f"files-{number}", script=READ + WRITE, input_data=None, timeout_seconds=10,
                        session=conversation, files=(csv,),
                    ), moved, span="a call with files", cpu=cpu["files"])  # fmt: skip
                    assert said == f"kept:{len(csv.content)}\n1", said
            report("later call (x += 1)", later, 0)
            print(f"  later calls: mean {statistics.mean(later) * 1000:.1f} ms, max {max(later) * 1000:.1f} ms",
                  flush=True)
            if files:
                report("later call, 1 MiB CSV in and 200 KB PNG out", moved, 0)
                print(f"  the manager's CPU per later call, p50: {statistics.median(cpu['later']) * 1000:.1f} ms; "
                      f"with the files: {statistics.median(cpu['files']) * 1000:.1f} ms", flush=True)
        finally:
            await backend.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--firsts", type=int, default=10)
    parser.add_argument("--cpu", default="250m", help="the script pods' CPU (requests = limits)")
    parser.add_argument("--memory", default="128Mi")
    parser.add_argument("--no-files", dest="files", action="store_false",
                        help="leave out the later calls with files")
    arguments = parser.parse_args()
    asyncio.run(main(runs=arguments.runs, firsts=arguments.firsts, cpu=arguments.cpu, memory=arguments.memory,
                     files=arguments.files))
