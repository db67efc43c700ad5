"""The conversation files a script request names, fetched by the scripts-manager from the console (issue 35):
read in chunks as the request's validated agent, only from the named conversation; an id of another conversation
or agent is refused exactly like one nobody holds, and nobody but the scripts-manager may ask."""

from __future__ import annotations

import secrets

import pytest

from rockbot.bus import CONSOLE, SCRIPTS_MANAGER, AmqpBus, BusError, MemoryBroker, Principal
from rockbot.bus.permissions import permissions_for
from rockbot.bus.topology import CONSOLE_FILE_READS, agent_replies
from rockbot.console.file_reads import FileReadAnswerer
from rockbot.console.file_store import FileOwner, FileStore
from rockbot.console.store import Store
from rockbot.contracts.files import CHUNK_BYTES, ReadFile
from rockbot.contracts.scripts import InputFiles, ScriptInvokeRequest, ScriptInvokeResponse
from rockbot.scripts_manager.app import ScriptsManager
from rockbot.scripts_manager.input_files import ConsoleInputs, InputsUnavailable
from tests.buses import ALICE, login
from tests.fixtures.rabbitmq import Vhost
from tests.scripts_manager.conftest import MakeSettings

ANN = FileOwner(namespace=ALICE.namespace, agent=ALICE.name, caller="console:ann", session_id="s1")


async def test_the_manager_reads_only_the_named_conversations_files_and_another_is_as_missing(store: Store) -> None:
    files = FileStore(store=store)
    big = bytes(range(256)) * (CHUNK_BYTES // 256 + 1000)  # more than one chunk
    small = await files.save(owner=ANN, name="sales.csv", content=b"month,revenue\n2026-01,10\n", origin="upload")
    large = await files.save(owner=ANN, name="big.bin", content=big, origin="upload")
    bobs = await files.save(owner=ANN.model_copy(update={"caller": "console:bob"}), name="bob.csv", content=b"x",
                            origin="upload")  # fmt: skip
    broker = MemoryBroker()
    answerer = FileReadAnswerer(files=files, bus=await login(broker, CONSOLE))
    await answerer.start()
    inputs = ConsoleInputs(await login(broker, SCRIPTS_MANAGER))
    try:
        got = await inputs.fetch(InputFiles(caller="console:ann", session_id="s1", ids=(small.id, large.id)),
                                 agent=ALICE)  # fmt: skip
        assert [(f.name, f.content) for f in got] == [("sales.csv", b"month,revenue\n2026-01,10\n"), ("big.bin", big)]

        async def refusal(file_id: str, *, agent: Principal = ALICE) -> str:
            with pytest.raises(InputsUnavailable) as raised:
                await inputs.fetch(InputFiles(caller="console:ann", session_id="s1", ids=(file_id,)), agent=agent)
            assert not raised.value.retryable
            return str(raised.value).replace(file_id, "ID")

        nobodys = await refusal("f" + secrets.token_hex(16))
        assert nobodys == "input_files: ID: no such file in this conversation"
        assert await refusal(bobs.id) == nobodys  # another caller's file, named under ann's conversation
        other_agent = Principal.agent(namespace=ALICE.namespace, name="mallory")
        assert await refusal(small.id, agent=other_agent) == nobodys  # ann's file, asked for as another agent's
    finally:
        await answerer.stop()


async def test_only_the_scripts_manager_asks_for_file_reads() -> None:
    assert not permissions_for(ALICE).allows("topic_write", CONSOLE_FILE_READS.name)
    assert permissions_for(SCRIPTS_MANAGER).allows("topic_write", CONSOLE_FILE_READS.name)
    assert permissions_for(CONSOLE).allows("read", CONSOLE_FILE_READS.name)
    # The console answers only on the scripts-manager's own reply queues, not on an agent's.
    answerer = FileReadAnswerer(files=None, bus=None)  # type: ignore[arg-type]

    class Sent:
        sender, reply_to = CONSOLE, "service.scripts-manager.replies.x"

    assert answerer.asker(Sent()) is None  # type: ignore[arg-type]
    Sent.sender = SCRIPTS_MANAGER
    assert answerer.asker(Sent()) == SCRIPTS_MANAGER  # type: ignore[arg-type]
    Sent.reply_to = agent_replies(namespace="default", name="alice", slot=0).name
    assert answerer.asker(Sent()) is None  # type: ignore[arg-type]
    assert ReadFile.model_json_schema()["properties"]["file_id"]["pattern"] == r"^f[0-9a-f]{32}$"


async def test_a_script_sees_the_files_its_request_names_under_input(store: Store, make_settings: MakeSettings
                                                                     ) -> None:  # fmt: skip
    files = FileStore(store=store)
    sales = await files.save(owner=ANN, name="sales.csv", content=b"month,revenue\n2026-01,10\n", origin="upload")
    broker = MemoryBroker()
    answerer = FileReadAnswerer(files=files, bus=await login(broker, CONSOLE))
    await answerer.start()
    manager = ScriptsManager(settings=make_settings(scripts_local_isolation="bwrap"),
                             bus=await login(broker, SCRIPTS_MANAGER))  # fmt: skip
    await manager.start()
    agent = await login(broker, ALICE)
    try:
        async def run(ids: tuple[str, ...]) -> object:
            request = ScriptInvokeRequest(
                request_id=secrets.token_hex(8), agent=ALICE.name,
                script="import os; print(sorted(os.listdir('/input'))); print(open('/input/sales.csv').read())",
                input_files=InputFiles(caller="console:ann", session_id="s1", ids=ids),
            )  # fmt: skip
            from rockbot.bus.topology import SCRIPT_INVOKE
            from rockbot.contracts.scripts import SCRIPT_INVOKE_REPLY

            reply = await agent.request(queue=SCRIPT_INVOKE, body=request, reply_queue=await agent.own_replies(),
                                        correlation_id=request.request_id, timeout_seconds=60,
                                        responder=SCRIPTS_MANAGER)  # fmt: skip
            return SCRIPT_INVOKE_REPLY.validate_json(reply.body)

        answer = await run((sales.id,))
        assert isinstance(answer, ScriptInvokeResponse), answer
        assert answer.stdout == "['sales.csv']\nmonth,revenue\n2026-01,10\n\n", answer
        refused = await run(("f" + secrets.token_hex(16),))
        assert refused.kind == "error" and "no such file in this conversation" in refused.error.message  # type: ignore[union-attr]
    finally:
        await manager.stop()
        await answerer.stop()


async def test_file_reads_cross_a_real_broker_only_from_the_scripts_manager(store: Store, vhost: Vhost) -> None:
    """On RabbitMQ the scripts-manager declares its own reply queue and reads a file; an agent may not even
    publish a read (the broker refuses its routing key)."""
    files = FileStore(store=store)
    sales = await files.save(owner=ANN, name="sales.csv", content=b"a,b\n1,2\n", origin="upload")
    async with await AmqpBus.connect(url=await vhost.url(CONSOLE)) as console, \
            await AmqpBus.connect(url=await vhost.url(SCRIPTS_MANAGER)) as manager, \
            await AmqpBus.connect(url=await vhost.url(ALICE)) as alice:  # fmt: skip
        answerer = FileReadAnswerer(files=files, bus=console)
        await answerer.start()
        try:
            got = await ConsoleInputs(manager).fetch(
                InputFiles(caller="console:ann", session_id="s1", ids=(sales.id,)), agent=ALICE)
            assert [(f.name, f.content) for f in got] == [("sales.csv", b"a,b\n1,2\n")]
            read = ReadFile(namespace=ALICE.namespace, agent=ALICE.name, caller="console:ann", session_id="s1",
                            file_id=sales.id)  # fmt: skip
            with pytest.raises(BusError):
                await alice.publish(queue=CONSOLE_FILE_READS, body=read)
        finally:
            await answerer.stop()
