"""A conversation's files in the run store (PostgreSQL and SQLite) and as the console serves them (issue 35)."""

from __future__ import annotations

import asyncio
import base64
import datetime
import re
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from pydantic import ValidationError

from rockbot.cli import main
from rockbot.console.api import add_file_routes, add_run_routes
from rockbot.console.auth_sessions import Sessions
from rockbot.console.authentication import Identity
from rockbot.console.authorization import CHAT, Action
from rockbot.console.file_store import FileOwner, FileStore
from rockbot.console.files import save_files
from rockbot.console.store import Batch, Store
from rockbot.console.web.gate import Gate
from rockbot.contracts.files import MAX_FILES_PER_CONVERSATION, FileContent, SaveFiles
from rockbot.contracts.recording import new_run_id
from tests.console.events import typical_run
from tests.console.test_runs_api import OnlyNamespaces
from tests.fixtures.serving import serving

T0 = datetime.datetime(2026, 11, 1, 12, 0, tzinfo=datetime.UTC)
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="
)
ANN = FileOwner(namespace="team-a", agent="triage", caller="console:ann", session_id="s1")
BOB = ANN.model_copy(update={"caller": "console:bob"})


@pytest.fixture
def files(store: Store) -> FileStore:
    return FileStore(store=store)


@pytest.fixture
async def api(store: Store) -> AsyncIterator[str]:
    app = web.Application(middlewares=[Gate(tokens=None, sessions=Sessions(),
                                            local_identity=Identity(username="ann")).middleware()])  # fmt: skip
    add_run_routes(app, store=store, authorizer=OnlyNamespaces("team-a"))
    add_file_routes(app, store=store, authorizer=OnlyNamespaces("team-a"))
    async with serving(app) as url:
        yield url


async def _get(url: str) -> tuple[int, dict[str, str], bytes]:
    async with aiohttp.ClientSession() as http, http.get(url) as response:
        return response.status, dict(response.headers), await response.read()


async def test_a_conversations_files_are_read_only_by_that_conversation(files: FileStore) -> None:
    csv = await files.save(owner=ANN, name="sales.csv", content=b"month,revenue\n", origin="upload")
    chart = await files.save(owner=ANN, name="charts/a.png", content=PNG, origin="script", run_id="r1")
    assert (csv.media_type, chart.media_type, chart.size) == ("text/csv", "image/png", len(PNG))
    assert len(csv.id) == 33 and csv.id != chart.id
    assert [f.name for f in await files.conversation(owner=ANN)] == ["sales.csv", "charts/a.png"]
    assert await files.conversation(owner=BOB) == []
    assert [f.id for f in await files.of_run("r1")] == [chart.id]
    found = await files.read(chart.id, owner=ANN)
    assert found is not None and found[1] == PNG
    # Another caller, agent or session with the id in hand: nothing, exactly as for an id nobody holds.
    for other in (BOB, ANN.model_copy(update={"agent": "other"}), ANN.model_copy(update={"session_id": "s2"})):
        assert await files.read(chart.id, owner=other) is None
    assert await files.read("f" + "0" * 32, owner=ANN) is None


async def test_a_file_is_typed_from_its_bytes_and_a_path_never_becomes_its_name(files: FileStore) -> None:
    fake = await files.save(owner=ANN, name="x.png", content=b"<html><script>alert(1)</script>", origin="script")
    assert fake.media_type == "application/octet-stream"
    svg = await files.save(owner=ANN, name="c.svg", content=b"<svg><script>alert(1)</script></svg>", origin="script")
    assert svg.media_type == "image/svg+xml"
    for bad in ("../etc/passwd", "/etc/passwd", "a/../../b", "bell\x07.txt"):
        with pytest.raises(ValidationError):
            await files.save(owner=ANN, name=bad, content=b"x", origin="upload")


async def test_files_go_with_their_retention(store: Store, files: FileStore) -> None:
    old = await files.save(owner=ANN, name="a.txt", content=b"a", origin="upload", retention_days=1, now=T0)
    kept = await files.save(owner=ANN, name="b.txt", content=b"b", origin="upload", retention_days=30, now=T0)
    await store.delete_expired(now=T0 + datetime.timedelta(days=2))
    assert [f.id for f in await files.conversation(owner=ANN)] == [kept.id]
    assert await files.read(old.id, owner=ANN) is None


async def test_a_persons_attachments_take_their_turns_run_and_its_retention(store: Store, files: FileStore) -> None:
    events = typical_run(at=T0, retention_days=400, caller="console:ann")
    run_id = events[0].run_id
    await store.write(batches=[Batch(namespace="team-a", agent="triage", events=events)])
    mine = await files.save(owner=ANN, name="sales.csv", content=b"a\n", origin="upload", now=T0)
    bobs = await files.save(owner=BOB, name="b.csv", content=b"b\n", origin="upload", now=T0)
    unrecorded = await files.save(owner=ANN, name="c.csv", content=b"c\n", origin="upload", now=T0)
    await files.attach([mine.id, bobs.id], owner=ANN, run_id=run_id)
    await files.attach([unrecorded.id], owner=ANN, run_id="not-recorded-yet")
    by_id = {f.id: f for f in [*await files.conversation(owner=ANN), *await files.conversation(owner=BOB)]}
    assert (by_id[mine.id].run_id, by_id[mine.id].expires_at) == (run_id, T0 + datetime.timedelta(days=400))
    assert (by_id[bobs.id].run_id, by_id[bobs.id].expires_at) == ("", bobs.expires_at)  # not ann's: untouched
    assert (by_id[unrecorded.id].run_id, by_id[unrecorded.id].expires_at) == ("not-recorded-yet",
                                                                              unrecorded.expires_at)


async def test_the_console_shows_only_raster_images_inline_and_everything_else_downloads(
    store: Store, files: FileStore, api: str
) -> None:
    events = typical_run(at=T0)
    run_id = events[0].run_id
    await store.write(batches=[Batch(namespace="team-a", agent="triage", events=events)])
    chart = await files.save(owner=ANN, name="charts/a.png", content=PNG, origin="script", run_id=run_id)
    fake = await files.save(owner=ANN, name="fake.png", content=b"<html><script>alert(1)</script>", origin="script",
                            run_id=run_id)  # fmt: skip
    svg = await files.save(owner=ANN, name='c"; x=.svg', content=b"<svg onload=alert(1)/>", origin="script",
                           run_id=run_id)  # fmt: skip

    status, headers, body = await _get(f"{api}/api/files/{chart.id}")
    assert (status, headers["Content-Type"], body) == (200, "image/png", PNG)
    assert headers["Content-Disposition"] == "inline; filename*=UTF-8''a.png"
    assert headers["X-Content-Type-Options"] == "nosniff" and "sandbox" in headers["Content-Security-Policy"]
    for stored, filename in ((fake, "fake.png"), (svg, "c%22%3B%20x%3D.svg")):
        status, headers, _ = await _get(f"{api}/api/files/{stored.id}")
        assert status == 200 and headers["Content-Type"] == "application/octet-stream"
        assert headers["Content-Disposition"] == f"attachment; filename*=UTF-8''{filename}"
        assert headers["X-Content-Type-Options"] == "nosniff"

    status, _, body = await _get(f"{api}/api/runs/{run_id}/files")
    assert status == 200 and b"charts/a.png" in body and b"fake.png" in body


async def test_a_file_of_a_namespace_the_person_may_not_read_is_as_missing_as_one_that_does_not_exist(
    files: FileStore, api: str
) -> None:
    hidden = await files.save(owner=ANN.model_copy(update={"namespace": "team-b"}), name="plans.csv",
                              content=b"secret plans", origin="upload")  # fmt: skip
    refused = await _get(f"{api}/api/files/{hidden.id}")
    missing = await _get(f"{api}/api/files/f{'0' * 32}")
    assert refused[0] == missing[0] == 404
    assert refused[2].replace(hidden.id.encode(), b"ID") == missing[2].replace(b"f" + b"0" * 32, b"ID")
    assert b"secret" not in refused[2]


class ChatsIn:
    """An authorizer that lets the user chat in one namespace, and nothing else (no reading its runs)."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace

    async def allowed(self, *, identity: Identity, namespace: str, action: Action) -> bool:
        return namespace == self.namespace and action == CHAT


async def test_a_person_who_may_only_chat_reads_their_own_chats_files_and_nobody_elses(
    store: Store, files: FileStore
) -> None:
    app = web.Application(middlewares=[Gate(tokens=None, sessions=Sessions(),
                                            local_identity=Identity(username="ann")).middleware()])  # fmt: skip
    add_file_routes(app, store=store, authorizer=ChatsIn("team-b"))
    in_b = {"namespace": "team-b"}
    own = await files.save(owner=ANN.model_copy(update=in_b), name="a.csv", content=b"mine", origin="upload")
    bobs = await files.save(owner=BOB.model_copy(update=in_b), name="b.csv", content=b"his", origin="upload")
    elsewhere = await files.save(owner=ANN, name="c.csv", content=b"team-a", origin="upload")  # may not chat there
    async with serving(app) as url:
        assert (await _get(f"{url}/api/files/{own.id}"))[::2] == (200, b"mine")
        assert (await _get(f"{url}/api/files/{bobs.id}"))[0] == 404
        assert (await _get(f"{url}/api/files/{elsewhere.id}"))[0] == 404


async def test_rockbot_runs_files_saves_a_runs_files_under_their_last_name_and_never_through_a_link(
    store: Store, files: FileStore, api: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    events = typical_run(at=T0)
    run_id = events[0].run_id
    await store.write(batches=[Batch(namespace="team-a", agent="triage", events=events)])
    for name, content in (("charts/chart.png", PNG), ("a/x.csv", b"a\n"), ("b/x.csv", b"b\n")):
        await files.save(owner=ANN, name=name, content=content, origin="script", run_id=run_id)
    out = tmp_path / "out"
    out.mkdir()
    elsewhere = tmp_path / "elsewhere.png"
    (out / "chart.png").symlink_to(elsewhere)  # a link someone left: never written through

    code = await asyncio.to_thread(main, ["runs", "--url", api, "files", run_id, "--out", str(out)])
    listed = capsys.readouterr().out
    assert code == 0 and "charts/chart.png" in listed and "image/png" in listed
    code = await asyncio.to_thread(main, ["runs", "--url", api, "show", run_id])
    shown = capsys.readouterr().out
    assert code == 0 and "charts/chart.png" in shown.partition("\nfiles (rockbot runs files")[2], shown
    assert not elsewhere.exists()
    assert (out / "chart-2.png").read_bytes() == PNG
    assert {(out / "x.csv").read_bytes(), (out / "x-2.csv").read_bytes()} == {b"a\n", b"b\n"}

    hidden = typical_run(at=T0)
    await store.write(batches=[Batch(namespace="team-b", agent="other", events=hidden)])
    code = await asyncio.to_thread(main, ["runs", "--url", api, "files", hidden[0].run_id])
    assert code == 1 and "no run" in capsys.readouterr().err


async def test_rockbot_runs_files_reads_a_local_sqlite_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    database = tmp_path / "runs.db"
    store = await Store.open(url=f"sqlite:///{database}")
    try:
        events = typical_run(at=T0)
        await store.write(batches=[Batch(namespace="team-a", agent="triage", events=events)])
        await FileStore(store=store).save(owner=ANN, name="clean.csv", content=b"x\n", origin="script",
                                          run_id=events[0].run_id)  # fmt: skip
    finally:
        await store.close()
    code = await asyncio.to_thread(main, ["runs", "--database", str(database), "files", events[0].run_id, "--out",
                                          str(tmp_path / "got")])  # fmt: skip
    assert code == 0 and "clean.csv" in capsys.readouterr().out
    assert (tmp_path / "got" / "clean.csv").read_bytes() == b"x\n"
    code = await asyncio.to_thread(main, ["runs", "--database", str(database), "show", events[0].run_id])
    shown = capsys.readouterr().out
    assert code == 0 and f"files (rockbot runs files {events[0].run_id} --out DIR saves them):" in shown
    assert re.search(r"^f[0-9a-f]{32}\s+2\s+text/csv\s+clean\.csv$", shown, re.M), shown


async def test_what_models_and_people_add_is_bounded_per_conversation_and_a_scripts_output_per_call(
    files: FileStore,
) -> None:
    """A model saving tool results in a loop meets the conversation's bound, as a person's uploads do; a script's
    files are bounded by its call's output bounds instead (the scripts-manager's)."""
    run_id = new_run_id(namespace=ANN.namespace, agent=ANN.agent)
    for n in range(MAX_FILES_PER_CONVERSATION):
        await files.save(owner=ANN, name=f"r{n}.txt", content=b"x", origin="tool", run_id=run_id)

    def request(origin: str) -> SaveFiles:
        return SaveFiles(origin=origin, run_id=run_id, caller=ANN.caller, session_id=ANN.session_id,
                         files=[FileContent(name="one-more.txt", content=b"y")])  # fmt: skip

    for origin in ("tool", "upload"):
        refused = await save_files(files, namespace=ANN.namespace, agent=ANN.agent, request=request(origin))
        assert refused.files == [] and f"may hold at most {MAX_FILES_PER_CONVERSATION}" in refused.error, origin
    kept = await save_files(files, namespace=ANN.namespace, agent=ANN.agent, request=request("script"))
    assert [f.name for f in kept.files] == ["one-more.txt"] and not kept.error
