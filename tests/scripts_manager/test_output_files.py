"""A call's files too large for its answer (issue 35), kept in the console by the scripts-manager itself: written a
chunk at a time as the request's validated agent, only under that agent's own run and the conversation it named,
visible only once whole (a writer that stops leaves nothing visible, and the sweep deletes its chunks); the answer
names each file by id with its description. Up to the full bounds (10 MiB a file, 50 MiB a call), over them named."""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import secrets
import sqlite3
from pathlib import Path

import pytest

from rockbot.bus import CONSOLE, SCRIPTS_MANAGER, AmqpBus, BusError, MemoryBroker, Principal
from rockbot.bus.permissions import permissions_for
from rockbot.bus.topology import CONSOLE_FILE_WRITES, SCRIPT_INVOKE
from rockbot.console.file_store import PART_SECONDS, FileOwner, FileStore, Part
from rockbot.console.file_writes import FileWriteAnswerer, write_chunk
from rockbot.console.service import Console
from rockbot.console.settings import ConsoleSettings
from rockbot.console.store import Store
from rockbot.contracts.files import CHUNK_BYTES, WriteFile
from rockbot.contracts.recording import new_run_id
from rockbot.contracts.scripts import SCRIPT_INVOKE_REPLY, OutputFiles, ScriptInvokeRequest, ScriptInvokeResponse
from rockbot.scripts_manager.app import ScriptsManager
from rockbot.scripts_manager.backends.outputs import describe
from rockbot.scripts_manager.output_files import ConsoleOutputs
from tests.buses import ALICE, login
from tests.fixtures.rabbitmq import Vhost
from tests.scripts_manager.conftest import MakeSettings
from tests.waiting import bounded, eventually

MIB = 1024 * 1024
ANN = FileOwner(namespace=ALICE.namespace, agent=ALICE.name, caller="console:ann", session_id="s1")
MALLORY = Principal.agent(namespace=ALICE.namespace, name="mallory")


def chunk(run_id: str, content: bytes, *, size: int, offset: int = 0, file_id: str | None = None,
          owner: FileOwner = ANN, name: str = "big.bin") -> WriteFile:  # fmt: skip
    return WriteFile(namespace=owner.namespace, agent=owner.agent, run_id=run_id, caller=owner.caller,
                     session_id=owner.session_id, name=name, size=size, offset=offset, file_id=file_id,
                     content=content)  # fmt: skip


async def visible(files: FileStore, run_id: str) -> list[str]:
    return [file.name for file in await files.of_run(run_id)] + [f.name for f in await files.conversation(owner=ANN)]


async def test_a_file_is_seen_only_once_whole_and_a_stopped_writers_chunks_are_swept(store: Store) -> None:
    files, run_id = FileStore(store=store), new_run_id(namespace=ALICE.namespace, agent=ALICE.name)
    whole = secrets.token_bytes(2 * CHUNK_BYTES + 1000)
    first = await write_chunk(files, chunk(run_id, whole[:CHUNK_BYTES], size=len(whole)))
    assert (first.error, first.stored, first.complete) == ("", CHUNK_BYTES, False), first
    assert await visible(files, run_id) == [] and await files.read_any(first.id) is None  # nobody sees a part
    again = await write_chunk(files, chunk(run_id, whole[:CHUNK_BYTES], size=len(whole)))  # a new file, not this one
    skipped = await write_chunk(files, chunk(run_id, whole[2 * CHUNK_BYTES:], size=len(whole),
                                             offset=2 * CHUNK_BYTES, file_id=first.id))  # fmt: skip
    assert "chunks come in order" in skipped.error, skipped
    second = await write_chunk(files, chunk(run_id, whole[CHUNK_BYTES:2 * CHUNK_BYTES], size=len(whole),
                                            offset=CHUNK_BYTES, file_id=first.id))  # fmt: skip
    repeated = await write_chunk(files, chunk(run_id, whole[CHUNK_BYTES:2 * CHUNK_BYTES], size=len(whole),
                                              offset=CHUNK_BYTES, file_id=first.id))  # a redelivered copy  # fmt: skip
    assert (second.stored, repeated.stored, repeated.error) == (2 * CHUNK_BYTES, 2 * CHUNK_BYTES, "")
    assert await visible(files, run_id) == []
    last = await write_chunk(files, chunk(run_id, whole[2 * CHUNK_BYTES:], size=len(whole),
                                          offset=2 * CHUNK_BYTES, file_id=first.id))  # fmt: skip
    assert (last.id, last.complete, last.stored) == (first.id, True, len(whole)), last
    found = await files.read(first.id, owner=ANN)
    assert found is not None and found[1] == whole and found[0].origin == "script" and found[0].run_id == run_id
    assert await visible(files, run_id) == ["big.bin", "big.bin"]  # once by its run, once in its conversation

    # `again` began another file and its writer stopped: never seen, and its chunk goes with the sweep.
    later = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=PART_SECONDS + 1)
    assert await files.delete_stale_parts(now=datetime.datetime.now(datetime.UTC)) == 0
    assert await files.delete_stale_parts(now=later) == 1
    rest = await write_chunk(files, chunk(run_id, whole[CHUNK_BYTES:2 * CHUNK_BYTES], size=len(whole),
                                          offset=CHUNK_BYTES, file_id=again.id))  # fmt: skip
    assert "no file" in rest.error and await files.read_any(again.id) is None
    assert [f.id for f in await files.of_run(run_id)] == [first.id]


async def test_a_write_for_another_agents_run_or_conversation_is_refused(store: Store) -> None:
    files = FileStore(store=store)
    ours, theirs = (new_run_id(namespace=ALICE.namespace, agent=who.name) for who in (ALICE, MALLORY))
    refused = await write_chunk(files, chunk(theirs, b"x" * 10, size=10))  # alice (validated) names mallory's run
    assert refused.error == f"run {theirs} is not one of agent default/alice's runs" and not refused.id
    begun = await write_chunk(files, chunk(ours, b"x" * 10, size=20))
    bob = ANN.model_copy(update={"caller": "console:bob"})
    moved = await write_chunk(files, chunk(ours, b"y" * 10, size=20, offset=10, file_id=begun.id, owner=bob))
    assert "no file" in moved.error, moved  # its rest, written under another conversation: no such file there
    renamed = await write_chunk(files, chunk(ours, b"y" * 10, size=20, offset=10, file_id=begun.id, name="b.bin"))
    assert "no file" in renamed.error, renamed
    assert await files.of_run(ours) == [] and await files.of_run(theirs) == []
    # Only the scripts-manager may write, and an agent cannot even publish a write.
    assert not permissions_for(ALICE).allows("topic_write", CONSOLE_FILE_WRITES.name)
    assert permissions_for(SCRIPTS_MANAGER).allows("topic_write", CONSOLE_FILE_WRITES.name)
    assert permissions_for(CONSOLE).allows("read", CONSOLE_FILE_WRITES.name)


#: What the script writes under /output (in name order): five files of up to 10 MiB each with a small CSV among
#: them, 50 MiB less 970 bytes in all; then one that would pass the 50 MiB a call, and one over 10 MiB itself.
SIZES = {"a.bin": 10 * MIB, "b.bin": 10 * MIB, "c.bin": 10 * MIB, "d.bin": 10 * MIB, "e.bin": 10 * MIB - 1000,
         "f-over-call.bin": 2000, "g-over-file.bin": 10 * MIB + 1}  # fmt: skip
SCRIPT = f"""
import hashlib, os, random
for n, (name, size) in enumerate(sorted({SIZES!r}.items())):
    data = random.Random(n).randbytes(size)
    open('/output/' + name, 'wb').write(data)
    print(name, hashlib.sha256(data).hexdigest())
open('/output/clean.csv', 'w').write('month,revenue\\n2026-01,10\\n')
"""


async def test_files_up_to_the_full_bounds_come_back_whole_through_rabbitmq(
    store: Store, vhost: Vhost, make_settings: MakeSettings
) -> None:
    files = FileStore(store=store)
    run_id = new_run_id(namespace=ALICE.namespace, agent=ALICE.name)
    async with await AmqpBus.connect(url=await vhost.url(CONSOLE)) as console, \
            await AmqpBus.connect(url=await vhost.url(ALICE)) as alice:  # fmt: skip
        writes = FileWriteAnswerer(files=files, bus=console)
        await writes.start()
        manager = ScriptsManager(settings=make_settings(amqp_url=await vhost.url(SCRIPTS_MANAGER),
                                                        scripts_local_isolation="bwrap"))  # fmt: skip
        await manager.start()
        try:
            async def call(script: str, run: str) -> ScriptInvokeResponse:
                request = ScriptInvokeRequest(
                    request_id=secrets.token_hex(8), agent=ALICE.name, script=script, timeout_seconds=120,
                    output_files=OutputFiles(run_id=run, caller=ANN.caller, session_id=ANN.session_id),
                )  # fmt: skip
                reply = await alice.request(queue=SCRIPT_INVOKE, body=request, reply_queue=await alice.own_replies(),
                                            correlation_id=request.request_id, timeout_seconds=240,
                                            responder=SCRIPTS_MANAGER)  # fmt: skip
                answer = SCRIPT_INVOKE_REPLY.validate_json(reply.body)
                assert isinstance(answer, ScriptInvokeResponse) and answer.exit_code == 0, answer
                return answer

            answer = await call(SCRIPT, run_id)
            mallorys = await call("open('/output/big.bin', 'wb').write(b'z' * (4 * 1024 * 1024))",
                                  new_run_id(namespace=ALICE.namespace, agent=MALLORY.name))  # fmt: skip
        finally:
            await manager.stop()
            await writes.stop()
    digests = dict(line.split() for line in answer.stdout.splitlines())
    csv = b"month,revenue\n2026-01,10\n"  # small: it travels in the answer, and the agent keeps it (console.files)
    assert [(a.name, a.size, a.content) for a in answer.artifacts] == [
        ("a.bin", 10 * MIB, b""), ("b.bin", 10 * MIB, b""), ("c.bin", 10 * MIB, b""),
        ("clean.csv", 25, csv), ("d.bin", 10 * MIB, b""), ("e.bin", 10 * MIB - 1000, b""),
    ]  # fmt: skip
    assert answer.artifacts[3].preview == "month,revenue\n2026-01,10" and answer.artifacts[3].media_type == "text/csv"
    assert answer.artifacts[3].id is None
    assert answer.artifacts_dropped == (
        f"f-over-call.bin: 2,000 bytes would pass the bound of {50 * MIB:,} bytes per call",
        f"g-over-file.bin: {10 * MIB + 1:,} bytes, over the bound of {10 * MIB:,} bytes per file",
    )
    for artifact in answer.artifacts:
        if artifact.name == "clean.csv":
            continue
        assert artifact.id is not None
        found = await files.read(artifact.id, owner=ANN)
        assert found is not None and found[0].run_id == run_id and found[0].size == artifact.size
        assert hashlib.sha256(found[1]).hexdigest() == digests[artifact.name], artifact.name
    assert sorted(f.name for f in await files.of_run(run_id)) == ["a.bin", "b.bin", "c.bin", "d.bin", "e.bin"]
    # A run id of another agent in alice's request: the console keeps nothing, and the answer says so by name.
    assert mallorys.artifacts == () and len(mallorys.artifacts_dropped) == 1
    assert mallorys.artifacts_dropped[0].startswith("big.bin: 4,194,304 bytes, not kept: run ")
    assert mallorys.artifacts_dropped[0].endswith("is not one of agent default/alice's runs")


async def test_an_agent_cannot_write_to_the_console_file_writes(vhost: Vhost) -> None:
    async with await AmqpBus.connect(url=await vhost.url(ALICE)) as alice:
        write = chunk(new_run_id(namespace=ALICE.namespace, agent=ALICE.name), b"x", size=1)
        with pytest.raises(BusError):
            await alice.publish(queue=CONSOLE_FILE_WRITES, body=write)


async def test_the_console_process_takes_file_writes_and_its_sweep_deletes_a_dead_writers_chunks(
    vhost: Vhost, tmp_path: Path
) -> None:
    """`rockbot console` as deployed (its own broker login, its SQLite store here): it answers the scripts-manager's
    writes, and its retention sweep deletes the chunks of a file whose writer stopped an hour ago or more."""
    database = f"sqlite:///{tmp_path / 'runs.db'}"
    run_id = new_run_id(namespace=ALICE.namespace, agent=ALICE.name)
    store = await Store.open(url=database)
    try:
        stale = await FileStore(store=store).write_part(Part(
            owner=ANN, run_id=run_id, name="old.bin", size=10, offset=0, file_id=None,
        ), b"x" * 5, now=datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=PART_SECONDS + 60))
    finally:
        await store.close()

    def parts() -> list[tuple[str, str]]:
        with contextlib.closing(sqlite3.connect(tmp_path / "runs.db")) as db:
            return db.execute("select file_id, name from file_parts").fetchall()

    assert parts() == [(stale.id, "old.bin")]
    console = Console(settings=ConsoleSettings(
        database_url=database, amqp_url=await vhost.url(CONSOLE), serve_http=False, retention_sweep_seconds=0.2,
        health_host="127.0.0.1", health_port=0))  # fmt: skip
    await console.start()
    try:
        async with await AmqpBus.connect(url=await vhost.url(SCRIPTS_MANAGER)) as manager:
            answer = ScriptInvokeResponse(request_id="r", stdout="", stderr="", exit_code=0, duration_seconds=0.1,
                                          artifacts=(describe("big.csv", b"a,b\n" * 1_000_000),))  # fmt: skip
            kept = await ConsoleOutputs(manager, inline_bytes=0).keep(
                answer, target=OutputFiles(run_id=run_id, caller=ANN.caller, session_id=ANN.session_id), agent=ALICE)
        assert kept.artifacts_dropped == () and kept.artifacts[0].id is not None, kept
        assert console.store is not None
        files = FileStore(store=console.store)
        found = await files.read(kept.artifacts[0].id, owner=ANN)
        assert found is not None and found[1] == b"a,b\n" * 1_000_000

        async def swept() -> None:
            assert parts() == []

        await eventually(swept, within=30)  # and big.csv's chunks went when it was whole
        assert await files.read_any(stale.id) is None
    finally:
        await console.stop()


async def test_a_console_too_slow_to_keep_a_calls_files_drops_them_by_name_within_the_bound() -> None:
    """Nobody answers `console.file-writes`: the call's large file is left out, said by name, once the bound on
    keeping a call's files has passed (the agent was told it waits that much longer)."""
    broker = MemoryBroker()
    outputs = ConsoleOutputs(await login(broker, SCRIPTS_MANAGER), inline_bytes=10, keep_seconds=0.5)
    answer = ScriptInvokeResponse(request_id="r", stdout="", stderr="", exit_code=0, duration_seconds=0.1,
                                  artifacts=(describe("small.csv", b"a\n"), describe("big.bin", b"x" * 100)))
    kept = await bounded(outputs.keep(answer, agent=ALICE, target=OutputFiles(
        run_id=new_run_id(namespace=ALICE.namespace, agent=ALICE.name), caller=ANN.caller, session_id="s1")),
        within=10, what="the keeping of the call's files")  # fmt: skip
    assert [(a.name, a.content, a.id) for a in kept.artifacts] == [("small.csv", b"a\n", None)]
    assert kept.artifacts_dropped == (
        "big.bin: 100 bytes, not kept: the console took longer than 0.5 s to keep the call's files",)
