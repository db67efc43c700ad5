"""Issue 30's crash check: under steady load, each component of the release dies as the OOM killer kills (SIGKILL
of its container's process on the node) or its pod is force-deleted, one at a time, and the Agent keeps answering.

Three clients chat without pause with the checks' shared Agent (one replica); every turn makes the scripted model run
a script that prints the turn's unique marker, and the model's last answer says whether the script's output came
back. Per crash it measures the turns that failed (an HTTP error, or a script that could not run: the model's answer
quotes the tool's error) until the next crash, and the seconds from the crash to the end of the first good turn that
started after it (looked for up to `HEAL_WINDOW`); the table is printed and kept in README.md ("Crashes under
load"). The bar (issue 30), for every crash but the Agent's only replica: at most 3 turns fail, each with a clear
error, and a good turn within 30 s. For all: no turn waits more than 60 s, every answered turn is a run in the store
exactly once, and no script runs twice. The broker's case is an expected failure (issue 30) only when the broker
itself was not Ready again within the 30 s (its restart recovers its files first, slower on a loaded node): no turn
can be answered without it. A client waits 1 s after a failed turn before the next (as a person
retrying), so a refused connection is not counted hundreds of times.

These checks run after every other check but `uninstall` (they leave containers restarted, which the
no-restart checks would see).
"""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import re
import secrets
import signal
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from e2e.conftest import (
    LOGS,
    Agent,
    Json,
    Kubectl,
    ModelServer,
    Release,
    Releases,
    pods_ready,
    start_agent,
    until,
)
from rockbot.console.runs_cli import HttpRuns
from rockbot.console.store_models import MAX_PAGE, RunFilter, RunSummary
from tests.fixtures.llm import ScriptedCall, Turn

pytestmark = pytest.mark.crashes

CLIENTS = 3
#: No turn may wait longer for its answer (issue 30); a client gives up a little after it, to see one that did.
TURN_BOUND = 60.0
#: After a crash, how long to look for the first good turn before moving on.
HEAL_WINDOW = 45.0
#: The bar after any single crash but the Agent's only replica (issue 30).
MOST_FAILED = 3
GOOD_WITHIN = 30.0


@dataclass(frozen=True)
class Crash:
    """One crash: `component` is the chart's component label (or `agent`); `kill` SIGKILLs its container's process,
    otherwise its pod is force-deleted. `bar`: whether issue 30's bar applies (not to the Agent's only replica)."""

    label: str
    component: str
    kill: bool
    bar: bool = True


CRASHES = (
    Crash("console", "console", kill=True),
    Crash("run store (PostgreSQL)", "runstore", kill=True),
    Crash("gateway", "gateway", kill=True),
    Crash("operator", "operator", kill=True),
    Crash("RabbitMQ", "rabbitmq", kill=True),
    Crash("scripts-manager, SIGKILL", "scripts-manager", kill=True),
    Crash("scripts-manager, pod force-deleted", "scripts-manager", kill=False),
    Crash("agent (its only replica), pod force-deleted", "agent", kill=False, bar=False),
)


@dataclass
class TurnResult:
    marker: str
    started: float
    ended: float
    #: The Agent's answer (None when the HTTP request failed).
    answer: str | None
    #: Why the turn failed, as the client saw it; None for a good turn.
    error: str | None

    @property
    def good(self) -> bool:
        return self.error is None


@dataclass
class Measured:
    crash: Crash
    at: float
    turns: list[TurnResult]
    #: Seconds from the crash to the end of the first good turn that started after it; None if none in the window.
    healed: float | None
    #: Seconds from the crash until the crashed part was back (restarted or replaced) and Ready again.
    ready: float

    @property
    def failed(self) -> list[TurnResult]:
        return [turn for turn in self.turns if not turn.good]

    def row(self) -> str:
        healed = f"{self.healed:.1f} s" if self.healed is not None else f"none within {HEAL_WINDOW:g} s"
        return f"| {self.crash.label} | {len(self.failed)} of {len(self.turns)} | {healed} | {self.ready:.1f} s |"


@dataclass
class Results:
    measured: list[Measured]
    turns: list[TurnResult]
    #: Per marker, how many tool results came back to the model holding that turn's script output.
    script_outputs: Counter[str]
    #: Per marker (a turn's session), its runs in the store.
    runs: Counter[str]
    table: str = ""
    errors: list[str] = field(default_factory=list)

    def of(self, label: str) -> Measured:
        (found,) = [m for m in self.measured if m.crash.label == label]
        return found


def respond(body: Json) -> Turn:
    """The scripted model: a user's turn makes it run a script printing the turn's marker; the tool's answer makes it
    say whether the marker came back (quoting the tool's error when not)."""
    messages = body.get("messages") or []
    users = [m for m in messages if m.get("role") == "user" and isinstance(m.get("content"), str)]
    found = re.search(r"turn (\S+)", users[-1]["content"]) if users else None
    if found is None:
        return Turn(text="no turn marker")
    marker = found.group(1)
    if messages[-1].get("role") == "user":
        script = f'print("RAN-" + "{marker}")'  # the output holds RAN-<marker>; the source does not
        return Turn(tool_calls=[ScriptedCall(name="execute_python_script", arguments={"script": script})])
    result = str(messages[-1].get("content"))
    return Turn(text=f"done {marker}" if f"RAN-{marker}" in result else f"failed {marker}: {result[:400]}")


def chat(url: str, *, token: str, marker: str) -> TurnResult:
    """One turn (its own session, named by its marker) through the Agent's Service."""
    request = urllib.request.Request(
        url, method="POST",
        data=json.dumps({"model": "e2e", "messages": [{"role": "user", "content": f"Run turn {marker}"}]}).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json", "X-Session-Id": marker},
    )  # fmt: skip
    started = time.monotonic()
    answer: str | None = None
    try:
        with urllib.request.urlopen(request, timeout=TURN_BOUND + 5) as response:
            answer = json.load(response)["choices"][0]["message"]["content"]
        error = None if answer == f"done {marker}" else f"answered: {answer}"
    except urllib.error.HTTPError as refused:
        error = f"HTTP {refused.code}: {refused.read().decode(errors='replace')[:400]}"
    except (OSError, ValueError, KeyError) as exc:  # refused, reset, timed out, an unreadable answer
        error = f"{type(exc).__name__}: {exc}"
    return TurnResult(marker=marker, started=started, ended=time.monotonic(), answer=answer, error=error)


class Load:
    """`CLIENTS` threads chatting without pause (1 s after a failed turn), every turn recorded."""

    def __init__(self, *, url: str, token: str) -> None:
        self.turns: list[TurnResult] = []
        self._url, self._token = url, token
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._client, args=(n,), daemon=True) for n in range(CLIENTS)]

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(TURN_BOUND + 10)

    def _client(self, number: int) -> None:
        for n in range(100_000):
            if self._stop.is_set():
                return
            result = chat(self._url, token=self._token, marker=f"c{number}-{n}-{secrets.token_hex(3)}")
            with self._lock:
                self.turns.append(result)
            if not result.good:
                self._stop.wait(1.0)

    def since(self, at: float) -> list[TurnResult]:
        with self._lock:
            return [turn for turn in self.turns if turn.ended >= at]


def component_pods(kubectl: Kubectl, release: Release, agent: Agent, component: str) -> list[Json]:
    selector = (f"app.kubernetes.io/name=rockbot-agent,app.kubernetes.io/instance={agent.name}" if component == "agent"
                else f"app.kubernetes.io/component={component},app.kubernetes.io/instance={release.name}")
    pods = kubectl.json("get", "pods", "-n", release.namespace, "-l", selector)["items"]
    return [pod for pod in pods if not pod["metadata"].get("deletionTimestamp")]


def victim(kubectl: Kubectl, release: Release, pods: list[Json]) -> Json:
    """The pod to crash: the one holding a Lease of the release's namespace (a leader), else the first."""
    holders = {(lease["spec"] or {}).get("holderIdentity") or ""
               for lease in kubectl.json("get", "leases", "-n", release.namespace)["items"]}
    leaders = [pod for pod in pods if any(pod["metadata"]["name"] in holder for holder in holders)]
    return (leaders or pods)[0]


def container_pid(pod: Json) -> int:
    """The host pid of the pod's first container's init process, found by its cgroup (the rig's node is containerd on
    this machine): the process of the container's cgroup whose parent (the shim) is outside it."""
    status = pod["status"]["containerStatuses"][0]
    container = status["containerID"].split("://", 1)[1]
    members: dict[int, int] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if container in (proc / "cgroup").read_text():
                members[int(proc.name)] = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue  # ended meanwhile
    inits = [pid for pid, parent in members.items() if parent not in members]
    assert len(inits) == 1, f"no single init process in the cgroup of container {container}: {members}"
    return inits[0]


def crash(kubectl: Kubectl, release: Release, agent: Agent, what: Crash) -> Callable[[], bool]:
    """Crash `what`; returns a probe that is true once the crashed container was restarted or the pod replaced."""
    pod = victim(kubectl, release, component_pods(kubectl, release, agent, what.component))
    name, uid = pod["metadata"]["name"], pod["metadata"]["uid"]
    if what.kill:
        restarted = pod["status"]["containerStatuses"][0]["restartCount"]
        os.kill(container_pid(pod), signal.SIGKILL)

        def back() -> bool:
            now = kubectl.json("get", "pod", name, "-n", release.namespace)
            return now["status"]["containerStatuses"][0]["restartCount"] > restarted

        return back
    kubectl.run("delete", "pod", name, "-n", release.namespace, "--grace-period=0", "--force", "--wait=false")
    return lambda: uid not in {p["metadata"]["uid"] for p in component_pods(kubectl, release, agent, what.component)}


def recorded_runs(console: str, token: str, *, agent: Agent, since: datetime.datetime) -> Counter[str]:
    """The Agent's runs since `since` in the store (through the console's read API), counted by session."""

    async def count() -> Counter[str]:
        api = HttpRuns(url=console, token=token)
        found: list[RunSummary] = []
        cursor: str | None = None
        try:
            while True:
                page = await api.list_runs(filters=RunFilter(namespace=agent.namespace, agent=agent.name,
                                                             since=since), limit=MAX_PAGE, cursor=cursor)  # fmt: skip
                found += page.runs
                if not (cursor := page.next_cursor):
                    return Counter(run.session_id for run in found)
        finally:
            await api.close()

    return asyncio.run(count())


def one_replica(kubectl: Kubectl, agent: Agent) -> None:
    """The shared Agent at one replica (a check before may have left two), its one pod Ready."""
    kubectl.run("patch", "agent", agent.name, "-n", agent.namespace, "--type=merge", "-p", '{"spec":{"replicas":1}}')
    until("the Agent at one Ready replica", lambda: len(pods := [
        pod for pod in kubectl.json("get", "pods", "-n", agent.namespace, "-l",
                                    f"app.kubernetes.io/name=rockbot-agent,app.kubernetes.io/instance={agent.name}")[
            "items"]]) == 1 and pods_ready(pods), within=120)  # fmt: skip


@pytest.fixture(scope="module")
def results(releases: Releases, model_server: ModelServer, kubectl: Kubectl,
            request: pytest.FixtureRequest) -> Iterator[Results]:
    release = releases.current()
    if release.shared_agent is None:
        release.shared_agent = start_agent(release, name="e2e-assistant")
    agent = release.shared_agent
    one_replica(kubectl, agent)
    model = model_server.llm.reset()
    model.loop = True
    model.play(respond)
    service = kubectl.json("get", "service", f"rockbot-{agent.name}", "-n", agent.namespace)["spec"]
    url = f"http://{service['clusterIP']}:{service['ports'][0]['port']}/v1/chat/completions"
    token = kubectl.secret(f"rockbot-{agent.name}-http-token", "token", namespace=agent.namespace)
    since = datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=5)
    crashed: list[tuple[Crash, float, float | None, float]] = []
    try:
        with Load(url=url, token=token) as load:
            until("a first good turn under load", lambda: any(turn.good for turn in load.since(0)), within=60)
            for what in CRASHES:
                at = time.monotonic()
                back = crash(kubectl, release, agent, what)
                healed, ready = _watch(load, after=at, ready=lambda back=back, what=what: back() and pods_ready(
                    component_pods(kubectl, release, agent, what.component)))
                crashed.append((what, at, healed, ready))
                # Every pod Ready and a good turn: the next crash starts from a working system.
                until("every pod of the release Ready", lambda: pods_ready(release.pods()), within=90)
                _first_good(load, after=time.monotonic())
        turns = load.turns
        ends = [at for _, at, _, _ in crashed[1:]] + [float("inf")]
        measured = [Measured(crash=what, at=at, healed=healed, ready=ready,
                             turns=[turn for turn in turns if at <= turn.ended < end])
                    for (what, at, healed, ready), end in zip(crashed, ends, strict=True)]  # fmt: skip
        outputs = Counter(marker for sent in model.requests for message in sent.messages
                          if message.get("role") == "tool"
                          for marker in re.findall(r"RAN-(c\d+-\d+-[0-9a-f]+)", str(message.get("content"))))
        runs = _runs_of(kubectl, release, agent, since=since,
                        answered={turn.marker for turn in turns if turn.answer is not None})
    finally:
        model.loop = False
    table = "\n".join(["| crash | turns failed | first good turn after | crashed part Ready again after |",
                       "| --- | --- | --- | --- |",
                       *(m.row() for m in measured)])  # fmt: skip
    errors = sorted({f"{m.crash.label}: {turn.error}" for m in measured for turn in m.failed})
    LOGS.mkdir(parents=True, exist_ok=True)
    (LOGS / "crashes.md").write_text(table + "\n\n" + "\n".join(errors) + "\n")
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if reporter is not None and capture is not None:
        with capture.global_and_fixture_disabled():  # printed as measured, not only when a check fails
            for line in ["", f"crashes under load ({CLIENTS} clients, {len(turns)} turns):", table, *errors[:40]]:
                reporter.write_line(line)
    yield Results(measured=measured, turns=turns, script_outputs=outputs, runs=runs, table=table, errors=errors)


def _runs_of(kubectl: Kubectl, release: Release, agent: Agent, *, since: datetime.datetime,
             answered: set[str]) -> Counter[str]:
    """The Agent's runs by session, read as a user bound to the console's viewer role, once every answered turn has
    one (or after a minute: the check then names the turns missing)."""
    reader = "e2e-crashes-reader"
    kubectl.run("create", "serviceaccount", reader, "-n", release.namespace)
    kubectl.run("create", "rolebinding", reader, "-n", release.namespace,
                f"--clusterrole={release.name}-console-viewer", f"--serviceaccount={release.namespace}:{reader}")
    try:
        token = kubectl.run("create", "token", reader, "-n", release.namespace, "--duration=10m").strip()
        console = kubectl.json("get", "service", f"{release.name}-console", "-n", release.namespace)["spec"]
        url = f"http://{console['clusterIP']}:{console['ports'][0]['port']}"
        runs: Counter[str] = Counter()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not answered <= set(runs):
            runs = recorded_runs(url, token, agent=agent, since=since)
            time.sleep(2)
        return runs
    finally:
        kubectl.run("delete", "rolebinding,serviceaccount", reader, "-n", release.namespace, "--ignore-not-found",
                    check=False)


def _watch(load: Load, *, after: float, ready: Callable[[], bool]) -> tuple[float | None, float]:
    """Seconds from `after` to the end of the first good turn that started after it (looked for up to `HEAL_WINDOW`,
    else None) and until `ready` (up to 90 s, else the check fails)."""
    healed: float | None = None
    back: float | None = None
    while back is None or (healed is None and time.monotonic() < after + HEAL_WINDOW):
        if healed is None:
            good = [turn.ended for turn in load.since(after) if turn.good and turn.started >= after]
            healed = min(good) - after if good else None
        if back is None and ready():
            back = time.monotonic() - after
        assert back is not None or time.monotonic() < after + 90, "the crashed part not back and Ready within 90 s"
        time.sleep(0.5)
    return healed, back


def _first_good(load: Load, *, after: float) -> float | None:
    """When the first good turn that started after `after` ended (looked for up to `HEAL_WINDOW`), or None."""
    deadline = after + HEAL_WINDOW
    while time.monotonic() < deadline:
        good = [turn.ended for turn in load.since(after) if turn.good and turn.started >= after]
        if good:
            return min(good)
        time.sleep(0.2)
    return None


def clear(error: str) -> bool:
    """An error a person can act on: said by the Agent (an HTTP error or the tool's message), not a client's wait that
    ran out or a connection cut without a word."""
    return not re.search(r"timed out|RemoteDisconnected|IncompleteRead|ConnectionReset", error)


@pytest.mark.parametrize("label", [
    pytest.param(crash.label, id=f"{crash.component}-{'kill' if crash.kill else 'delete'}")
    for crash in CRASHES if crash.bar])  # fmt: skip
def test_after_a_crash_at_most_three_turns_fail_clearly_and_a_good_turn_comes_within_30_s(
    results: Results, label: str
) -> None:
    measured = results.of(label)
    if measured.crash.component == "rabbitmq" and measured.ready > GOOD_WITHIN:
        pytest.xfail(f"issue 30: the broker itself was Ready again only {measured.ready:.1f} s after its crash (its "
                     "own restart on this machine: recovering its files, under the load of the node), so no turn "
                     f"could be answered within {GOOD_WITHIN:g} s")
    assert measured.healed is not None and measured.healed <= GOOD_WITHIN, results.table
    assert len(measured.failed) <= MOST_FAILED, [turn.error for turn in measured.failed]
    assert all(clear(turn.error or "") for turn in measured.failed), [turn.error for turn in measured.failed]


def test_the_agents_only_replica_comes_back_and_its_failed_turns_say_why(results: Results) -> None:
    (measured,) = [m for m in results.measured if not m.crash.bar]
    assert measured.healed is not None, results.table
    assert all(turn.error for turn in measured.failed)


def test_no_turn_waits_more_than_60_s(results: Results) -> None:
    slow = {turn.marker: round(turn.ended - turn.started, 1) for turn in results.turns
            if turn.ended - turn.started > TURN_BOUND}  # fmt: skip
    assert not slow, slow


def test_every_answered_turn_is_one_run_in_the_store_and_no_script_runs_twice(results: Results) -> None:
    answered = [turn.marker for turn in results.turns if turn.answer is not None]
    assert answered
    assert {marker: results.runs[marker] for marker in answered if results.runs[marker] != 1} == {}
    assert {marker: count for marker, count in results.script_outputs.items() if count > 1} == {}
    good = {turn.marker for turn in results.turns if turn.good}
    assert good <= set(results.script_outputs), good - set(results.script_outputs)

