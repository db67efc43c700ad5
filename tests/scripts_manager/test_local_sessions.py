"""Sessions in the local sandbox (`scriptSessions: PerConversation`): one real bubblewrap sandbox per
conversation, kept between calls, ended when idle, crashed or out of time, and never shared."""

from __future__ import annotations

import textwrap
import uuid
from collections.abc import AsyncIterator

import pytest

from rockbot.scripts_manager.backends import InputFile, ScriptJob, SessionTerms
from rockbot.scripts_manager.backends.local import LocalBackend
from rockbot.scripts_manager.backends.outputs import OutputBounds
from tests.scripts_manager.conftest import MakeSettings
from tests.waiting import eventually

ANN = SessionTerms(owner="agent.team.helper", session="a" * 32, idle_seconds=300, max_seconds=3600)
BOB = ANN.model_copy(update={"session": "b" * 32})


def call(script: str, *, session: SessionTerms = ANN, timeout: float = 10.0, memory: str | None = None) -> ScriptJob:
    return ScriptJob(request_id=uuid.uuid4().hex, script=textwrap.dedent(script), input_data="in",
                     timeout_seconds=timeout, session=session, memory=memory)  # fmt: skip


@pytest.fixture
async def sandbox(make_settings: MakeSettings) -> AsyncIterator[LocalBackend]:
    backend = await LocalBackend.create(settings=make_settings(scripts_local_isolation="bwrap"))
    yield backend
    await backend.close()


async def test_a_sessions_globals_imports_and_files_stay_for_its_next_call(sandbox: LocalBackend) -> None:
    first = await sandbox.run(call("""
        import json, sys
        rows = [1, 2, 3]
        open("kept.txt", "w").write("made in call one")
        print(sys.stdin.read())
    """))
    second = await sandbox.run(call("""
        print(sum(rows), json.dumps(open("kept.txt").read()))
    """))
    assert (first.session, first.exit_code, first.stdout) == ("new", 0, "in\n"), first
    assert (second.session, second.exit_code, second.stdout) == ("kept", 0, '6 "made in call one"\n'), second
    assert second.backend == "local/bwrap"


async def test_two_conversations_and_two_agents_never_share_a_session(sandbox: LocalBackend) -> None:
    await sandbox.run(call("secret = 'ann'"))
    other_agent = ANN.model_copy(update={"owner": "agent.other.helper"})  # the same digest from another sender
    for terms in (BOB, other_agent):
        peek = await sandbox.run(call("print(globals().get('secret')); import os; print(os.listdir('.'))",
                                      session=terms))  # fmt: skip
        assert (peek.session, peek.stdout) == ("new", "None\n[]\n"), peek
    assert (await sandbox.run(call("print(secret)"))).stdout == "ann\n"


async def test_a_script_that_kills_its_interpreter_ends_the_session_and_the_next_call_says_so(
    sandbox: LocalBackend,
) -> None:
    await sandbox.run(call("x = 41"))
    killed = await sandbox.run(call("import os, signal; os.kill(os.getpid(), signal.SIGKILL)"))
    assert killed.session == "ended" and killed.exit_code == 137, killed
    after = await sandbox.run(call("print(x)"))
    assert after.session == "restarted", after
    assert after.exit_code == 1 and "NameError" in after.stderr, after


async def test_a_timeout_ends_the_session_with_what_it_printed(sandbox: LocalBackend) -> None:
    await sandbox.run(call("x = 1"))
    stuck = await sandbox.run(call("print('working', flush=True)\nwhile True: pass", timeout=1.0))
    assert (stuck.timed_out, stuck.exit_code, stuck.session, stuck.stdout) == (True, None, "ended", "working\n")
    assert (await sandbox.run(call("print(globals().get('x'))"))).stdout == "None\n"


async def test_exit_codes_and_tracebacks_of_a_call_keep_the_session(sandbox: LocalBackend) -> None:
    exited = await sandbox.run(call("import sys\nkept = True\nsys.exit(3)"))
    failed = await sandbox.run(call("1 / 0"))
    assert (exited.exit_code, exited.session) == (3, "new")
    assert failed.exit_code == 1 and "ZeroDivisionError" in failed.stderr and failed.session == "kept"
    assert "kernel.py" not in failed.stderr, failed.stderr  # the kernel's own frames are not the script's
    assert (await sandbox.run(call("print(kept)"))).stdout == "True\n"


async def test_an_idle_session_ends_and_its_next_call_says_restarted(sandbox: LocalBackend) -> None:
    brief = ANN.model_copy(update={"idle_seconds": 1})
    await sandbox.run(call("x = 1", session=brief))
    assert len(sandbox.sessions) == 1

    async def ended() -> None:
        assert len(sandbox.sessions) == 0

    await eventually(ended)
    after = await sandbox.run(call("print(globals().get('x'))", session=brief))
    assert (after.session, after.stdout) == ("restarted", "None\n")


async def test_other_limits_for_the_same_conversation_make_a_new_sandbox_and_say_so(sandbox: LocalBackend) -> None:
    await sandbox.run(call("x = 1"))
    changed = await sandbox.run(call("print(globals().get('x'))", memory="128Mi"))
    assert (changed.session, changed.stdout) == ("restarted", "None\n")


async def test_an_agent_past_its_sessions_ends_its_least_recently_used_idle_one(make_settings: MakeSettings) -> None:
    backend = await LocalBackend.create(settings=make_settings(scripts_local_isolation="bwrap",
                                                               scripts_sessions_per_agent=1))
    try:
        await backend.run(call("x = 1"))
        assert (await backend.run(call("x = 2", session=BOB))).session == "new"
        assert len(backend.sessions) == 1
        assert (await backend.run(call("print(globals().get('x'))"))).session == "restarted"
    finally:
        await backend.close()


async def test_each_call_of_a_session_sees_its_own_files_and_returns_what_it_wrote(sandbox: LocalBackend) -> None:
    first = call("""
        import os
        table = open("/input/sales.csv").read()
        open("/output/clean.csv", "w").write(table.upper())
    """).model_copy(update={"files": (InputFile(name="sales.csv", content=b"month,revenue\n"),)})
    second = call("""
        import os
        print(sorted(os.listdir("/input")), sorted(os.listdir("/output")), table.strip())
    """).model_copy(update={"files": (InputFile(name="costs.csv", content=b"x"),)})
    made = await sandbox.run(first)
    seen = await sandbox.run(second)
    assert [(a.name, a.content) for a in made.artifacts] == [("clean.csv", b"MONTH,REVENUE\n")], made
    assert (seen.session, seen.stdout, seen.artifacts) == ("kept", "['costs.csv'] [] month,revenue\n", ()), seen


async def test_pandas_loaded_in_one_call_is_used_in_the_next(sandbox: LocalBackend) -> None:
    """The data packages scripts/setup installs for the sandbox's Python (Debian's python3-numpy, -pandas)."""
    load = call("""
        import pandas as pd
        sales = pd.read_csv("/input/sales.csv")
        print(len(sales))
    """).model_copy(update={"files": (InputFile(name="sales.csv", content=b"month,revenue\n1,10\n2,30\n"),)})
    total = call("""
        sales["share"] = sales.revenue / sales.revenue.sum()
        sales.to_csv("/output/clean.csv", index=False)
        print(sales.revenue.sum())
    """)
    loaded = await sandbox.run(load)
    summed = await sandbox.run(total)
    assert (loaded.exit_code, loaded.stdout) == (0, "2\n"), loaded.stderr
    assert (summed.exit_code, summed.session, summed.stdout) == (0, "kept", "40\n"), summed.stderr
    assert [(a.name, a.content) for a in summed.artifacts] == [
        ("clean.csv", b"month,revenue,share\n1,10,0.25\n2,30,0.75\n")], summed


async def test_a_session_drops_links_out_of_output_and_files_over_the_bound_and_shows_figures(
    sandbox: LocalBackend,
) -> None:
    """The pod backend's contract too (test_pod_sessions.py): what a call wrote within bounds, links and files over
    the bound dropped and said, `plt.show()` as a file, and nothing of an earlier call given back again."""
    hostile = await sandbox.run(call("""
        import os
        os.symlink("/etc/passwd", "/output/passwd")
        open("/output/big.bin", "wb").write(b"x" * 1001)
        open("/output/ok.txt", "w").write("fine")
    """, memory="1Gi").model_copy(update={"output_bounds": OutputBounds(files=3, file_bytes=1000, total_bytes=1500)}))
    figure = await sandbox.run(call("""
        import matplotlib.pyplot as plt
        plt.plot([1, 2], [2, 1])
        plt.show()
    """, memory="1Gi"))
    assert (hostile.session, hostile.exit_code) == ("new", 0), hostile.stderr
    assert [(a.name, a.content) for a in hostile.artifacts] == [("ok.txt", b"fine")], hostile
    assert sorted(hostile.artifacts_dropped) == [
        "big.bin: 1,001 bytes, over the bound of 1,000 bytes per file",
        "passwd: a symbolic link (only files written under /output come back)",
    ], hostile
    assert (figure.session, figure.exit_code) == ("kept", 0), figure.stderr
    assert [(a.name, a.media_type) for a in figure.artifacts] == [("figure-1.png", "image/png")], figure
