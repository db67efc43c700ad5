"""The local sandbox against real subprocesses: isolation, limits and output, as a script sees them."""

from __future__ import annotations

import asyncio
import os
import sys
import textwrap
import uuid
import zipfile
from pathlib import Path

import pytest

from rockbot.scripts_manager.backends import SandboxUnavailable, ScriptJob
from rockbot.scripts_manager.backends.local import LocalBackend
from rockbot.scripts_manager.packages import PackageCache
from tests.scripts_manager.conftest import MakeSettings
from tests.waiting import eventually


def job(
    script: str, *, input_data: str | None = None, timeout: float = 10.0, packages: tuple[str, ...] = ()
) -> ScriptJob:
    return ScriptJob(
        request_id=uuid.uuid4().hex, script=textwrap.dedent(script), input_data=input_data,
        timeout_seconds=timeout, packages=packages,
    )  # fmt: skip


@pytest.fixture(params=["bwrap", "unshare"])
async def sandbox(request: pytest.FixtureRequest, make_settings: MakeSettings) -> LocalBackend:
    return await LocalBackend.create(settings=make_settings(scripts_local_isolation=request.param))


async def test_stdout_and_stderr_come_back_apart_with_the_exit_code(sandbox: LocalBackend) -> None:
    result = await sandbox.run(job("""
        import sys
        data = sys.stdin.read()
        print("out:", data.upper())
        print("err line", file=sys.stderr)
        sys.exit(3)
    """, input_data="hello"))
    assert (result.stdout, result.stderr, result.exit_code) == ("out: HELLO\n", "err line\n", 3)
    assert not (result.timed_out or result.oom_killed or result.output_truncated)


async def test_script_cannot_connect_to_a_listener_on_the_hosts_loopback(sandbox: LocalBackend) -> None:
    connections = 0

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        writer.close()

    server = await asyncio.start_server(accept, host="127.0.0.1", port=0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        result = await sandbox.run(job(f"""
            import socket
            try:
                socket.create_connection(("127.0.0.1", {port}), timeout=3)
                print("connected")
            except OSError as exc:
                print("refused", type(exc).__name__)
        """))
    assert result.stdout.startswith("refused"), result
    assert connections == 0


async def test_script_cannot_resolve_names(sandbox: LocalBackend) -> None:
    result = await sandbox.run(job("""
        import socket
        try:
            socket.getaddrinfo("rockbot-sandbox-test.invalid", 443)
            print("resolved")
        except socket.gaierror as exc:
            print("no resolver", exc.errno == socket.EAI_AGAIN)
    """))
    assert result.stdout == "no resolver True\n", result


async def test_script_sees_none_of_the_parents_environment(
    sandbox: LocalBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ROCKBOT_MODEL_API_KEY", "sk-must-not-leak")
    result = await sandbox.run(job("import os, json; print(json.dumps(dict(os.environ)))"))
    assert "sk-must-not-leak" not in result.stdout
    import json

    seen = set(json.loads(result.stdout)) - {"PWD", "SHLVL", "_"}
    assert seen == {"PATH", "HOME", "TMPDIR", "LANG", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE", "PYTHONPATH"}


async def test_script_is_stopped_at_its_memory_limit(make_settings: MakeSettings) -> None:
    sandbox = await LocalBackend.create(settings=make_settings(scripts_memory="128Mi"))
    result = await sandbox.run(job("block = bytearray(512 * 1024 * 1024)\nprint('allocated')"))
    assert result.oom_killed is True
    assert result.exit_code == 137
    assert "allocated" not in result.stdout
    assert result.stderr.rstrip().endswith("MemoryError"), result.stderr


async def test_a_script_that_only_prints_memory_error_is_not_reported_out_of_memory(sandbox: LocalBackend) -> None:
    result = await sandbox.run(job("""
        import sys
        print("Traceback (most recent call last):\\nMemoryError", file=sys.stderr)
        sys.exit(1)
    """))
    assert result.stderr.rstrip().endswith("MemoryError"), result
    assert (result.exit_code, result.oom_killed) == (1, False)


async def test_a_script_cannot_fork_past_the_process_budget(make_settings: MakeSettings) -> None:
    sandbox = await LocalBackend.create(settings=make_settings(  # a budget of 8, as nobody when root
        scripts_concurrency=1, scripts_local_python="/usr/bin/python3"
    ))
    result = await sandbox.run(job("""
        import os, time
        children = []
        for _ in range(40):
            try:
                pid = os.fork()
            except OSError:
                break
            if pid == 0:
                time.sleep(2)
                os._exit(0)
            children.append(pid)
        print(len(children))
        for pid in children:
            os.waitpid(pid, 0)
    """))
    assert result.exit_code == 0, result
    assert int(result.stdout) < 8


async def test_timeout_kills_the_script_and_all_its_children(sandbox: LocalBackend) -> None:
    marker = f"{uuid.uuid4().int % 10**6 + 10**6}.5"
    result = await sandbox.run(job(f"""
        import os, subprocess, time
        subprocess.Popen(["sleep", "{marker}"])
        subprocess.Popen(["sleep", "{marker}"], start_new_session=True)
        print("started", flush=True)
        time.sleep(60)
    """, timeout=1.5))
    assert result.timed_out is True
    assert result.exit_code is None
    assert result.stdout == "started\n"

    async def none_left() -> None:
        leftovers = [pid for pid in os.listdir("/proc") if pid.isdigit() and marker.encode() in _cmdline(pid)]
        assert leftovers == []

    await eventually(none_left)  # killed processes leave /proc once reaped


def _cmdline(pid: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


async def test_output_over_the_cap_is_cut_and_flagged(make_settings: MakeSettings) -> None:
    sandbox = await LocalBackend.create(settings=make_settings(scripts_max_output_bytes=4096))
    result = await sandbox.run(job("import sys\nsys.stdout.write('x' * 100_000)\nsys.stderr.write('e' * 10)"))
    assert result.output_truncated is True
    assert result.stdout == "x" * 4096
    assert result.stderr == "e" * 10
    assert result.exit_code == 0


async def test_bubblewrap_gives_a_read_only_system_and_a_private_tmp(make_settings: MakeSettings) -> None:
    sandbox = await LocalBackend.create(settings=make_settings(scripts_local_isolation="bwrap"))
    marker = uuid.uuid4().hex
    result = await sandbox.run(job(f"""
        import os
        for path in ("/usr/rockbot-probe", "/sandbox/new-file"):
            try:
                open(path, "w").write("x")
                print("wrote", path)
            except OSError as exc:
                print("denied", path, exc.errno)
        open("/tmp/scratch-{marker}", "w").write("ok")
        print(sorted(os.listdir("/tmp")), os.getuid())
    """))
    assert "wrote" not in result.stdout, result
    assert result.stdout.splitlines()[-1] == f"['scratch-{marker}'] 65534"
    assert not await asyncio.to_thread(Path(f"/tmp/scratch-{marker}").exists)


async def test_without_any_isolation_the_sandbox_refuses_and_says_how_to_fix_it(
    make_settings: MakeSettings, tmp_path: Path
) -> None:
    with pytest.raises(SandboxUnavailable) as refused:
        await LocalBackend.create(settings=make_settings(), search_path=str(tmp_path))
    message = str(refused.value)
    assert "ROCKBOT_SCRIPTS_LOCAL_ISOLATION=auto" in message and "bwrap: not installed" in message
    assert "apt-get install -y bubblewrap" in message
    assert "ROCKBOT_SCRIPTS_LOCAL_ISOLATION=unsafe-none" in message


async def test_auto_never_falls_back_to_unshare_which_is_no_filesystem_sandbox(
    make_settings: MakeSettings, tmp_path: Path
) -> None:
    (tmp_path / "unshare").symlink_to("/usr/bin/unshare")  # unshare works here; bubblewrap is "missing"
    with pytest.raises(SandboxUnavailable) as refused:
        await LocalBackend.create(settings=make_settings(scripts_local_isolation="auto"), search_path=str(tmp_path))
    message = str(refused.value)
    assert "ROCKBOT_SCRIPTS_LOCAL_ISOLATION=auto" in message and "bwrap: not installed" in message
    assert "install bubblewrap" in message


async def test_unshare_runs_only_when_chosen_and_warns_that_it_writes_the_host(
    make_settings: MakeSettings, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "unshare").symlink_to("/usr/bin/unshare")
    sandbox = await LocalBackend.create(
        settings=make_settings(scripts_local_isolation="unshare"), search_path=str(tmp_path)
    )
    assert sandbox.isolation.kind == "unshare"
    [warning] = [r for r in caplog.records if r.levelname == "WARNING" and "UNSAFE" in r.getMessage()]
    assert "ROCKBOT_SCRIPTS_LOCAL_ISOLATION=unshare is not a sandbox" in warning.getMessage()
    assert "install bubblewrap" in warning.getMessage()


async def test_unsafe_runner_works_only_when_asked_for(make_settings: MakeSettings, tmp_path: Path) -> None:
    sandbox = await LocalBackend.create(
        settings=make_settings(scripts_local_isolation="unsafe-none"), search_path=str(tmp_path)
    )
    assert sandbox.isolation.kind == "unsafe-none"
    result = await sandbox.run(job("print(6 * 7)"))
    assert (result.stdout, result.exit_code) == ("42\n", 0)


def _make_wheel(directory: Path, *, name: str, version: str, module: str, source: str) -> Path:
    """A minimal pure-Python wheel, so package installs need no index and no network."""
    dist = f"{name}-{version}.dist-info"
    wheel = directory / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(f"{module}.py", source)
        archive.writestr(f"{dist}/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        archive.writestr(
            f"{dist}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        archive.writestr(f"{dist}/RECORD", "")
    return wheel


async def test_packages_are_installed_once_into_the_cache_and_visible_read_only(
    make_settings: MakeSettings, tmp_path: Path
) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _make_wheel(wheels, name="rockbot_demo_pkg", version="1.0", module="rockbot_demo", source="ANSWER = 42\n")
    sandbox = await LocalBackend.create(settings=make_settings(
        scripts_allowed_packages=["rockbot-demo-pkg"], scripts_pip_find_links=str(wheels)
    ))
    script = """
        import rockbot_demo
        print(rockbot_demo.ANSWER)
        try:
            open(rockbot_demo.__file__, "a").write("# changed")
            print("writable")
        except OSError:
            print("read-only")
    """
    first = await sandbox.run(job(script, packages=("rockbot-demo-pkg",)))
    assert first.stdout == "42\nread-only\n", first
    for wheel in wheels.iterdir():
        wheel.unlink()  # a second run must come from the cache, not from pip
    second = await sandbox.run(job(script, packages=("rockbot-demo-pkg",)))
    assert second.stdout == "42\nread-only\n", second


async def test_two_managers_installing_the_same_set_at_once_both_succeed(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _make_wheel(wheels, name="rockbot_demo_pkg", version="1.0", module="rockbot_demo", source="ANSWER = 42\n")
    caches = [
        PackageCache(root=tmp_path / "cache", python=sys.executable, index_url=None, find_links=str(wheels))
        for _ in range(2)
    ]  # two managers sharing one cache directory: their locks know nothing of each other
    first, second = await asyncio.gather(*(cache.ensure(("rockbot-demo-pkg",)) for cache in caches))
    assert first == second and (first / "rockbot_demo.py").is_file()
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [first.name]  # no staging left behind
