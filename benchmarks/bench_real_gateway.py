"""Webhook accept latency on the real node: the chart installed by helm, the gateway in its pod.

The chart is installed as e2e/ installs it (scripts/e2e-real: default values but the image and the
model endpoint), with one Agent whose model is the scripted server on the pod bridge and one webhook
Trigger. Signed webhooks go from this machine to the gateway's Service, one after another and then
--concurrency at once; each is timed from the request to its `202` (signature, decision, the run
recorded in the Trigger's status by a conditional write to the real API server, the publish to the
agent's inbox). The runs themselves go on in the background (the agent asks the model and answers).

    python -m benchmarks.bench_real_gateway [--runs 100] [--concurrency 4]

Needs the rig up and the image on the node (run scripts/e2e-real once; ROCKBOT_E2E_IMAGE names the
image, as there). Removes the release at the end.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchmarks.bench_scripts import percentile
from e2e.conftest import K8SREAL, Kubectl, ModelServer, bridge_listener, installed, start_agent
from e2e.test_webhook import deliver, make_trigger, send
from tests.chart.conftest import Helm, _fetch_helm


def timed(release: object, key: bytes, delivery: str) -> float:
    started = time.perf_counter()
    status, answer = send(release, body=json.dumps({"issue": delivery}).encode(), key=key, delivery=delivery)
    took = time.perf_counter() - started
    assert status == 202, (status, answer)
    return took


def report(label: str, samples: list[float]) -> None:
    p50, p95 = statistics.median(samples) * 1000, percentile(samples, 0.95) * 1000
    print(f"  {label:22} p50 {p50:6.1f} ms   p95 {p95:6.1f} ms   ({len(samples)} webhooks)", flush=True)


def main(*, runs: int, concurrency: int) -> None:
    kubectl = Kubectl(k8sreal=K8SREAL)
    helm = Helm(binary=_fetch_helm(), home=Path(tempfile.mkdtemp(prefix="bench-helm-")))
    server = ModelServer().start()
    server.llm.play({"text": "Noted."})
    server.llm.loop = True  # every run gets the same answer
    try:
        with bridge_listener() as target, installed(kubectl=kubectl, helm=helm, model=server.llm,
                                                    forbidden_target=target) as release:
            agent = start_agent(release, name="bench-hooks")
            key = make_trigger(kubectl, agent=agent)
            deliver(release, body=b'{"issue": "warm-up"}', key=key, delivery="warm-up")  # once the gateway serves it
            print(f"webhook accept latency on the real node (gateway pod of the chart, {kubectl.binary.parent}):")
            report("one after another", [timed(release, key, f"seq-{i}") for i in range(runs)])
            with ThreadPoolExecutor(concurrency) as senders:
                samples = list(senders.map(lambda i: timed(release, key, f"par-{i}"), range(runs)))
            report(f"{concurrency} at once", samples)
    finally:
        server.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--concurrency", type=int, default=4)
    arguments = parser.parse_args()
    main(runs=arguments.runs, concurrency=arguments.concurrency)
