"""A chat whose model runs a script: it runs in a pod of the scripts namespace, with no network at all."""

from __future__ import annotations

import re

from e2e.conftest import BRIDGE_HOST, Agent, Kubectl, Release, pods_ready, restarts, until
from tests.fixtures.llm import ScriptedLLM

#: Tries the network every way a script could (DNS, the API server, the model on the bridge) and says
#: where it ran (a pod's hostname is its name).
PROBE = """
import json, os, socket, sys
target = json.load(sys.stdin)

def attempt(action):
    try:
        action()
        return "open"
    except OSError as exc:
        return "blocked"

dns = attempt(lambda: socket.getaddrinfo("kubernetes.default.svc.cluster.local", 443))
api = attempt(lambda: socket.create_connection(("10.0.0.1", 443), 5).close())
model = attempt(lambda: socket.create_connection((target["host"], target["port"]), 5).close())
print(f"PROBE pod={socket.gethostname()} dns={dns} api={api} model={model} sum={sum(target['numbers'])}")
"""


def test_the_release_runs_with_no_restarts(release: Release) -> None:
    pods = release.pods()
    assert pods_ready(pods)
    assert restarts(pods) == {}
    names = {pod["metadata"]["labels"].get("app.kubernetes.io/component") for pod in pods}
    assert {"operator", "scripts-manager", "gateway"} <= names, names


def test_a_chat_runs_the_models_script_in_a_pod_without_network(
    agent: Agent, model: ScriptedLLM, kubectl: Kubectl, release: Release
) -> None:
    model.play(
        {"tool_calls": [{"name": "execute_python_script", "arguments": {
            "script": PROBE, "input_data": {"host": BRIDGE_HOST, "port": model.port, "numbers": [1, 2, 39]}}}]},
        {"text": "The probe ran in the sandbox."},
    )  # fmt: skip

    answer = agent.chat("Probe the sandbox.")

    assert answer == "The probe ran in the sandbox."
    (result,) = [m["content"] for m in model.requests[-1].messages if m.get("role") == "tool"]
    assert "dns=blocked api=blocked model=blocked sum=42" in result, result
    (pod,) = re.findall(r"PROBE pod=([a-z0-9.-]+) ", result)
    events = kubectl.json("get", "events", "-n", release.scripts_namespace,
                          "--field-selector", f"involvedObject.name={pod},reason=Scheduled")["items"]
    assert events, f"no pod {pod} was scheduled in {release.scripts_namespace}"
    until(f"script pod {pod} gone", lambda: not kubectl.run(
        "get", "pod", pod, "-n", release.scripts_namespace, "--ignore-not-found", "-o", "name"), within=60)


#: What a data-analysis agent runs on the chart's default script image (Dockerfile.scripts): pandas, then a chart.
ANALYSIS = """
import matplotlib.pyplot as plt
import pandas as pd
sales = pd.DataFrame({"month": ["2026-01", "2026-02", "2026-03"], "revenue": [10, 12, 9]})
sales.to_csv("/output/clean.csv", index=False)
sales.plot(x="month", y="revenue")
plt.show()
print("pandas", pd.__version__)
"""


def test_the_charts_default_script_image_runs_pandas_and_matplotlib_and_gives_files_back(
    agent: Agent, model: ScriptedLLM
) -> None:
    model.play(
        {"tool_calls": [{"name": "execute_python_script", "arguments": {"script": ANALYSIS}}]},
        {"text": "Charted."},
    )  # fmt: skip

    answer = agent.chat("Chart revenue by month.")
    assert answer.startswith("Charted."), answer  # then the kept files, each with its link on the console
    assert re.search(r"- clean\.csv \(text/csv, 46 bytes\): /api/files/f[0-9a-f]{32}\n", answer), answer
    assert re.search(r"- figure-1\.png \(image/png, [0-9,]+ bytes\): /api/files/f[0-9a-f]{32}", answer), answer
    (result,) = [m["content"] for m in model.requests[-1].messages if m.get("role") == "tool"]
    assert "exit code 0" in result and "pandas " in result, result
    assert re.search(r"- clean\.csv \(text/csv, 46 bytes\)\n    month,revenue", result), result
    assert re.search(r"- figure-1\.png \(image/png, [0-9,]+ bytes\)", result), result
