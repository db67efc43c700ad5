#!/usr/bin/env bash
# End-to-end run on a real cluster: kind, the image built and loaded, `helm install`, the examples
# applied and Ready, then a chat with an agent whose (scripted) model runs a script in a sandbox pod.
# Passes when the script's pod ran, is gone afterwards, and found no network from inside.
#
# Needs docker, kind (>= 0.24: its kindnet enforces NetworkPolicies), kubectl, helm, and a Python
# with rockbot's test extra installed (`pip install -e '.[test]'`) for the scripted LLM.
# Environment: ROCKBOT_E2E_CLUSTER (kind cluster name), ROCKBOT_E2E_KEEP=1 (keep the cluster),
# PYTHON (the interpreter to use).
set -euo pipefail
# Never put the working directory on sys.path: the repository's operator/ folder would shadow the
# standard library's `operator` module. Repository code is reached through the editable install.
export PYTHONSAFEPATH=1

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CLUSTER=${ROCKBOT_E2E_CLUSTER:-rockbot-e2e}
PYTHON=${PYTHON:-python3}
IMAGE_REPOSITORY=rockbot
IMAGE_TAG=e2e
SCRIPT_IMAGE=python:3.12-slim
NAMESPACE=rockbot
SCRIPTS_NAMESPACE=rockbot-scripts
AGENT=e2e-sandbox
LLM_PORT=8400
FORWARD_PORT=18080
WORK=$(mktemp -d)
FORWARD_PID=""

log() { printf '\n==> %s\n' "$*"; }
die() { printf 'e2e: %s\n' "$*" >&2; exit 1; }

diagnose() {
    log "diagnostics"
    kubectl get pods,deployments,statefulsets,services -A -o wide || true
    kubectl get agents,tools,scheduledtasks -A -o yaml || true
    kubectl -n "$NAMESPACE" logs deployment/rockbot-operator --tail=200 || true
    kubectl -n "$NAMESPACE" logs deployment/rockbot-scripts-manager --tail=200 || true
    kubectl -n "$NAMESPACE" logs "deployment/rockbot-$AGENT" --tail=200 || true
    kubectl -n "$SCRIPTS_NAMESPACE" get events --sort-by=.lastTimestamp || true
}

cleanup() {
    local status=$?
    if [[ -n $FORWARD_PID ]]; then kill "$FORWARD_PID" 2>/dev/null || true; fi
    if ((status != 0)); then diagnose; fi
    if [[ -z ${ROCKBOT_E2E_KEEP:-} ]]; then kind delete cluster --name "$CLUSTER" || true; fi
    rm -rf "$WORK"
    exit "$status"
}
trap cleanup EXIT

for tool in docker kind kubectl helm "$PYTHON"; do
    command -v "$tool" >/dev/null || die "$tool is not installed"
done

log "kind cluster $CLUSTER"
kind create cluster --name "$CLUSTER" --wait 180s
kubectl config use-context "kind-$CLUSTER"

log "image $IMAGE_REPOSITORY:$IMAGE_TAG (and the script image, preloaded)"
docker build --tag "$IMAGE_REPOSITORY:$IMAGE_TAG" "$ROOT"
docker pull --quiet "$SCRIPT_IMAGE"
kind load docker-image --name "$CLUSTER" "$IMAGE_REPOSITORY:$IMAGE_TAG" "$SCRIPT_IMAGE"

# Pods reach the host running this script at the gateway of kind's Docker network.
LLM_HOST=$(docker network inspect kind --format '{{range .IPAM.Config}}{{.Gateway}} {{end}}' |
    tr ' ' '\n' | grep -E '^[0-9]+(\.[0-9]+){3}$' | head -n 1)
[[ -n $LLM_HOST ]] || die "no IPv4 gateway on the kind network"
log "scripted LLM will listen on $LLM_HOST:$LLM_PORT"

log "helm install"
helm upgrade --install rockbot "$ROOT/charts/rockbot" \
    --namespace "$NAMESPACE" --create-namespace \
    --set image.repository="$IMAGE_REPOSITORY" --set image.tag="$IMAGE_TAG" --set image.pullPolicy=Never \
    --set-json "agents.egress.llmCIDRs=[\"$LLM_HOST/32\"]" --set-json "agents.egress.llmPorts=[$LLM_PORT]" \
    --set operator.logFormat=text --set scriptsManager.logFormat=text \
    --wait --timeout 10m

log "examples"
# Placeholder values for every Secret the examples reference, so their Agents can become Ready.
"$PYTHON" - "$ROOT/examples" >"$WORK/secret-refs" <<'EOF'
import pathlib, sys, yaml

def refs(node):
    if isinstance(node, dict):
        for field, value in node.items():
            if field.lower().endswith("secretref") and isinstance(value, dict) and "name" in value:
                yield value["name"], value.get("key", "api-key")
            else:
                yield from refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from refs(item)

found = set()
for path in sorted(pathlib.Path(sys.argv[1]).glob("*.y*ml")):
    for doc in yaml.safe_load_all(path.read_text()):
        found.update(refs(doc))
for name, key in sorted(found):
    print(name, key)
EOF
while read -r name key; do
    kubectl -n "$NAMESPACE" create secret generic "$name" --from-literal="$key=e2e-placeholder" \
        --dry-run=client -o yaml | kubectl apply -f -
done <"$WORK/secret-refs"
for manifest in "$ROOT"/examples/*.yaml; do
    kubectl -n "$NAMESPACE" apply -f "$manifest"
done

log "agent $AGENT, whose model is the scripted LLM"
kubectl -n "$NAMESPACE" apply -f - <<EOF
apiVersion: rockbot.dev/v1alpha1
kind: Agent
metadata:
  name: $AGENT
spec:
  description: Runs one probe script in a sandbox for the end-to-end test.
  model:
    baseUrl: http://$LLM_HOST:$LLM_PORT/v1
    name: scripted-model
  builtinTools: [scripts]
  # Generous: in a pod with no network a DNS lookup can take a minute to fail (search domains x retries).
  scriptLimits:
    timeoutSeconds: 300
EOF
kubectl -n "$NAMESPACE" wait agents --all --for=condition=Ready --timeout=300s
kubectl -n "$NAMESPACE" get agents

log "chat"
kubectl -n "$NAMESPACE" port-forward "service/rockbot-$AGENT" "$FORWARD_PORT:8080" >"$WORK/port-forward.log" 2>&1 &
FORWARD_PID=$!
for _ in $(seq 30); do
    if (echo >"/dev/tcp/127.0.0.1/$FORWARD_PORT") 2>/dev/null; then break; fi
    sleep 1
done
TOKEN=$(kubectl -n "$NAMESPACE" get secret "rockbot-$AGENT-http-token" -o jsonpath='{.data.token}' | base64 -d)
AGENT_URL="http://127.0.0.1:$FORWARD_PORT" AGENT_TOKEN="$TOKEN" AGENT="$AGENT" ROCKBOT_ROOT="$ROOT" \
    LLM_HOST="$LLM_HOST" LLM_PORT="$LLM_PORT" "$PYTHON" - <<'EOF'
"""Plays the model: asks for one probe script, then checks what the sandbox reported back."""
import asyncio, os, sys

import aiohttp

# The scripted LLM lives in tests/: appended after the standard library, so nothing there is shadowed.
sys.path.append(os.environ["ROCKBOT_ROOT"])
from tests.fixtures.llm import ScriptedLLM, Turn  # noqa: E402

PROBE = '''
import json, os, socket, sys
target = json.load(sys.stdin)

def attempt(action):
    try:
        action()
        return "open"
    except OSError:
        return "blocked"

dns = attempt(lambda: socket.getaddrinfo("kubernetes.default.svc.cluster.local", 443))
api = attempt(lambda: socket.create_connection((os.environ.get("KUBERNETES_SERVICE_HOST", "10.96.0.1"), 443), 5).close())
llm = attempt(lambda: socket.create_connection((target["host"], target["port"]), 5).close())
print(f"PROBE dns={dns} api={api} llm={llm}")
'''


async def main() -> int:
    llm = ScriptedLLM([
        Turn.model_validate({"tool_calls": [{"name": "execute_python_script", "arguments": {
            "script": PROBE, "input_data": {"host": os.environ["LLM_HOST"], "port": int(os.environ["LLM_PORT"])}}}]}),
        Turn(text="The probe ran in the sandbox."),
    ])
    await llm.start(host="0.0.0.0", port=int(os.environ["LLM_PORT"]))
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
            response = await session.post(
                f"{os.environ['AGENT_URL']}/v1/chat/completions",
                headers={"Authorization": f"Bearer {os.environ['AGENT_TOKEN']}"},
                json={"model": os.environ["AGENT"], "messages": [{"role": "user", "content": "Probe the sandbox."}]},
            )
            body = await response.json()
    finally:
        await llm.stop()
    print("agent answered:", response.status, body)
    if response.status != 200 or "probe ran" not in body["choices"][0]["message"]["content"]:
        return 1
    tool_results = [m.get("content") or "" for r in llm.requests for m in r.messages if m.get("role") == "tool"]
    print("the sandbox reported:", tool_results)
    if not any("PROBE dns=blocked api=blocked llm=blocked" in str(result) for result in tool_results):
        print("e2e: the script did not run, or it had network", file=sys.stderr)
        return 1
    return 0

sys.exit(asyncio.run(main()))
EOF

log "the script pod ran and is gone"
scheduled=$(kubectl -n "$SCRIPTS_NAMESPACE" get events --field-selector reason=Scheduled,involvedObject.kind=Pod -o name | wc -l)
((scheduled >= 1)) || die "no pod was ever scheduled in $SCRIPTS_NAMESPACE"
for _ in $(seq 60); do
    left=$(kubectl -n "$SCRIPTS_NAMESPACE" get pods -o name | wc -l)
    ((left == 0)) && break
    sleep 1
done
((left == 0)) || die "script pods are still there: $(kubectl -n "$SCRIPTS_NAMESPACE" get pods -o name)"

log "e2e passed: the agent ran a script in a network-less pod that is gone"
