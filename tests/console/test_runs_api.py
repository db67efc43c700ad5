"""The runs' read API over real HTTP, as the console serves it behind its gate, and `rockbot runs` reading it
(and reading `rockbot local`'s SQLite file directly)."""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from rockbot.cli import main
from rockbot.console.api import add_run_routes
from rockbot.console.auth_sessions import Sessions
from rockbot.console.authentication import Identity
from rockbot.console.authorization import Action
from rockbot.console.store import Batch, Store
from rockbot.console.web.gate import Gate
from tests.console.events import typical_run
from tests.fixtures.serving import serving

T0 = datetime.datetime(2026, 11, 1, 12, 0, tzinfo=datetime.UTC)


class OnlyNamespaces:
    """An authorizer that lets the user read some namespaces (as RBAC would answer)."""

    def __init__(self, *namespaces: str) -> None:
        self.namespaces = set(namespaces)

    async def allowed(self, *, identity: Identity, namespace: str, action: Action) -> bool:
        return namespace in self.namespaces


@pytest.fixture
async def api(store: Store) -> AsyncIterator[str]:
    app = web.Application(middlewares=[Gate(tokens=None, sessions=Sessions(),
                                            local_identity=Identity(username="ann")).middleware()])  # fmt: skip
    add_run_routes(app, store=store, authorizer=OnlyNamespaces("team-a"))
    async with serving(app) as url:
        yield url


async def _get(url: str) -> tuple[int, dict | str]:
    async with aiohttp.ClientSession() as http, http.get(url) as response:
        if response.content_type == "application/json":
            return response.status, await response.json()
        return response.status, await response.text()


async def test_the_api_lists_pages_and_opens_runs_of_namespaces_the_user_may_read(store: Store, api: str) -> None:
    mine = [typical_run(at=T0 + datetime.timedelta(minutes=i)) for i in range(3)]
    hidden = typical_run(at=T0, question="secret plans")
    await store.write(batches=[*(Batch(namespace="team-a", agent="triage", events=e) for e in mine),
                               Batch(namespace="team-b", agent="other", events=hidden)])  # fmt: skip

    status, first = await _get(f"{api}/api/runs?namespace=team-a&limit=2")
    assert status == 200 and [r["run_id"] for r in first["runs"]] == [mine[2][0].run_id, mine[1][0].run_id]
    status, second = await _get(f"{api}/api/runs?namespace=team-a&limit=2&cursor={first['next_cursor']}")
    assert [r["run_id"] for r in second["runs"]] == [mine[0][0].run_id] and second["next_cursor"] is None

    status, run = await _get(f"{api}/api/runs/{mine[0][0].run_id}")
    assert status == 200 and run["agent"] == "triage" and len(run["timeline"]) == len(mine[0]) - 2

    assert (await _get(f"{api}/api/runs?namespace=team-b"))[0] == 403
    status, text = await _get(f"{api}/api/runs/{hidden[0].run_id}")
    assert status == 404 and "secret" not in str(text)
    assert (await _get(f"{api}/api/runs/no-such-run"))[0] == 404

    status, session = await _get(f"{api}/api/sessions/team-a/triage/s1?caller=http")
    assert status == 200 and len(session["runs"]) == 3


async def test_bad_queries_name_the_field_and_the_fix(api: str) -> None:
    status, text = await _get(f"{api}/api/runs")
    assert status == 400 and "namespace is required" in text
    status, text = await _get(f"{api}/api/runs?namespace=team-a&outcome=Great")
    assert status == 400 and "outcome" in text
    status, text = await _get(f"{api}/api/runs?namespace=team-a&since=yesterday")
    assert status == 400 and "ISO 8601" in text
    status, text = await _get(f"{api}/api/runs?namespace=team-a&cursor=bogus")
    assert status == 400 and "cursor" in text


async def _cli(*args: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = await asyncio.to_thread(main, ["runs", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


async def test_rockbot_runs_reads_the_console(store: Store, api: str, capsys: pytest.CaptureFixture[str]) -> None:
    events = typical_run(at=T0)
    await store.write(batches=[Batch(namespace="team-a", agent="triage", events=events)])

    code, out, _ = await _cli("--url", api, "list", "-n", "team-a", capsys=capsys)
    assert code == 0 and "team-a/triage" in out and events[0].run_id in out and "Succeeded" in out

    code, out, _ = await _cli("--url", api, "show", events[0].run_id, capsys=capsys)
    assert code == 0
    assert "tool      tool_0" in out and "script    exit 0 on pods script-abc" in out and "hello" in out
    assert "user      What is 6 x 7?" in out and "assistant 42" in out

    code, _, err = await _cli("--url", api, "list", "-n", "team-b", capsys=capsys)
    assert code == 1 and "403" in err and "ann may not get agents in namespace team-b" in err


async def test_rockbot_runs_reads_a_local_sqlite_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    database = tmp_path / "runs.db"
    store = await Store.open(url=f"sqlite:///{database}")
    events = typical_run(at=T0, source="local")
    await store.write(batches=[Batch(namespace="default", agent="helper", events=events)])
    await store.close()

    code, out, _ = await _cli("--database", str(database), "list", capsys=capsys)
    assert code == 0 and "default/helper" in out and "local" in out
    code, out, _ = await _cli("--database", str(database), "--json", "show", events[0].run_id, capsys=capsys)
    assert code == 0 and '"source": "local"' in out
    code, _, err = await _cli("--database", str(tmp_path / "none.db"), "list", capsys=capsys)
    assert code == 1 and "no run store at" in err
