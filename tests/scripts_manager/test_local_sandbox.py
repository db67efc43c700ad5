"""The local sandbox against real subprocesses: isolation, limits and output, as a script sees them."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import uuid
import zipfile
from pathlib import Path

import pytest

from rockbot.scripts_manager.backends import SandboxUnavailable, ScriptJob
from rockbot.scripts_manager.backends.cgroups import MemoryCgroups
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
    assert seen == {"PATH", "HOME", "TMPDIR", "LANG", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE", "PYTHONPATH",
                    "ROCKBOT_INPUT_DIR", "ROCKBOT_OUTPUT_DIR", "MPLBACKEND", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"}


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


_FORKS = """
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
"""


async def test_a_script_cannot_fork_past_the_process_budget(make_settings: MakeSettings) -> None:
    sandbox = await LocalBackend.create(settings=make_settings())  # 8 processes, the interpreter included
    result = await sandbox.run(job(_FORKS))
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


async def test_packages_install_for_an_interpreter_without_pip(
    make_settings: MakeSettings, tmp_path: Path, shared_tmp: Path
) -> None:
    python = shared_tmp / "python" / "bin" / "python3.11"  # like Debian's python3 without python3-pip
    python.parent.mkdir(parents=True)
    shutil.copy2("/usr/bin/python3.11", python)
    (shared_tmp / "python" / "lib").mkdir()
    (shared_tmp / "python" / "lib" / "python3.11").symlink_to("/usr/lib/python3.11")
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _make_wheel(wheels, name="rockbot_demo_pkg", version="1.0", module="rockbot_demo", source="ANSWER = 42\n")
    sandbox = await LocalBackend.create(settings=make_settings(
        scripts_local_python=str(python), scripts_allowed_packages=["rockbot-demo-pkg"],
        scripts_pip_find_links=str(wheels),
    ))  # fmt: skip
    result = await sandbox.run(job(
        "import sys, rockbot_demo; print(sys.executable, rockbot_demo.ANSWER)", packages=("rockbot-demo-pkg",)
    ))
    assert result.stdout == f"{python} 42\n", result


async def test_two_managers_installing_the_same_set_at_once_both_succeed(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _make_wheel(wheels, name="rockbot_demo_pkg", version="1.0", module="rockbot_demo", source="ANSWER = 42\n")
    caches = [
        PackageCache(root=tmp_path / "cache", python=sys.executable, index_url=None, find_links=str(wheels))
        for _ in range(2)
    ]  # two managers sharing one cache directory: their locks know nothing of each other
    caches[0].check(reader_uid=os.geteuid())
    first, second = await asyncio.gather(*(cache.ensure(("rockbot-demo-pkg",)) for cache in caches))
    assert first == second and (first / "rockbot_demo.py").is_file()
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [first.name]  # no staging left behind


# Hostile scripts (issue 13 §3). Each is bounded by the very limit under test, a timeout, and cleanup.

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="only a root manager runs scripts as another user")


async def test_a_script_can_write_nowhere_but_its_sized_tmp_and_cannot_mount_more(
    make_settings: MakeSettings,
) -> None:
    sandbox = await LocalBackend.create(settings=make_settings(scripts_local_isolation="bwrap"))
    result = await sandbox.run(job("""
        import ctypes, os
        chunk = b"x" * (1 << 20)
        for folder in ("/", "/etc", "/dev", "/sandbox", "/usr"):
            written = 0
            try:
                with open(os.path.join(folder, "hostile"), "wb") as out:
                    for _ in range(4):
                        written += out.write(chunk)
                        out.flush()
            except OSError:
                pass
            print("wrote", folder, written)
        for line in open("/proc/self/mountinfo"):
            mount, super_block = line.split(" - ")
            mount_point, options = mount.split()[4], mount.split()[5].split(",")
            fs_type, _, super_options = super_block.split()
            if "rw" in options and fs_type == "tmpfs" and "size=" not in super_options:
                print("unsized writable tmpfs", mount_point)
        libc = ctypes.CDLL(None, use_errno=True)
        print("new user namespace", libc.unshare(0x10000000) == 0)  # CLONE_NEWUSER
        print("mounted", libc.mount(b"none", b"/tmp", b"tmpfs", 0, None) == 0)
    """))
    assert result.exit_code == 0, result
    assert result.stdout.splitlines() == [
        "wrote / 0", "wrote /etc 0", "wrote /dev 0", "wrote /sandbox 0", "wrote /usr 0",
        "new user namespace False", "mounted False",
    ]  # fmt: skip


@pytest.fixture(scope="module")
def private_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Python only root can reach, like a pyenv or a venv under /root (scripts/setup's venv on such hosts)."""
    home = tmp_path_factory.mktemp("private-home")
    home.chmod(0o700)
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(home / "venv")], check=True)
    return home / "venv"


@needs_root
async def test_scripts_never_run_as_root_when_nobody_cannot_run_the_default_interpreter(
    make_settings: MakeSettings, private_venv: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "base_prefix", str(private_venv))  # this process's base Python: nobody can't run it
    sandbox = await LocalBackend.create(settings=make_settings(scripts_concurrency=1))
    result = await sandbox.run(job("import sys; print(sys.prefix)\n" + textwrap.dedent(_FORKS)))
    assert result.exit_code == 0, result
    prefix, children = result.stdout.split()
    assert prefix == "/usr"  # picked Debian's /usr/bin/python3 by itself
    assert int(children) < 8


@needs_root
async def test_an_interpreter_nobody_cannot_run_is_refused_with_the_fix(
    make_settings: MakeSettings, private_venv: Path
) -> None:
    python = str(private_venv / "bin" / "python3")
    with pytest.raises(SandboxUnavailable) as refused:
        await LocalBackend.create(settings=make_settings(scripts_local_python=python))
    message = str(refused.value)
    assert f"ROCKBOT_SCRIPTS_LOCAL_PYTHON={python}" in message and "user nobody" in message
    assert "/usr/bin/python3" in message and "ROCKBOT_SCRIPTS_LOCAL_ISOLATION=unsafe-none" in message


async def _processes_with(marker: str) -> list[str]:
    return [pid for pid in os.listdir("/proc") if pid.isdigit() and marker.encode() in _cmdline(pid)]


async def test_one_scripts_fork_bomb_leaves_a_concurrent_script_its_own_budget(make_settings: MakeSettings) -> None:
    sandbox = await LocalBackend.create(settings=make_settings(scripts_concurrency=2))
    marker = f"{uuid.uuid4().int % 10**6 + 10**6}.5"
    bomb = asyncio.create_task(sandbox.run(job(f"""
        import os, subprocess
        for _ in range(64):  # bounded even if the budget under test did not hold
            try:
                subprocess.Popen(["sleep", "{marker}"])
            except OSError:
                break
        os.execv("/bin/sleep", ["sleep", "{marker}1"])  # says: no more processes to be had
    """, timeout=30)))
    try:

        async def saturated() -> None:
            assert await _processes_with(f"{marker}1")

        await eventually(saturated)
        result = await sandbox.run(job("print('unharmed')"))
        assert (result.stdout, result.exit_code) == ("unharmed\n", 0), result
    finally:
        bomb.cancel()
        await asyncio.gather(bomb, return_exceptions=True)

    async def none_left() -> None:
        assert await _processes_with(marker) == []

    await eventually(none_left)


async def test_processes_the_script_user_already_has_on_the_host_do_not_count_against_a_script(
    make_settings: MakeSettings,
) -> None:
    sandbox = await LocalBackend.create(settings=make_settings(scripts_concurrency=1))
    as_script_user = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--"] if os.geteuid() == 0 else []
    others = [await asyncio.create_subprocess_exec(*as_script_user, "sleep", "30") for _ in range(12)]
    try:  # the user's other processes: daemons that also run as nobody, or the manager's user's own
        result = await sandbox.run(job(_FORKS))
    finally:
        for other in others:
            other.kill()
            await other.wait()
    assert result.exit_code == 0, result
    assert 0 < int(result.stdout) < 8


@pytest.mark.skipif(MemoryCgroups.find() is None, reason="no memory cgroup for the manager here (not root, or v2)")
async def test_a_scripts_processes_are_held_to_its_memory_limit_together(make_settings: MakeSettings) -> None:
    sandbox = await LocalBackend.create(settings=make_settings(scripts_memory="128Mi"))
    result = await sandbox.run(job("""
        import os, signal, time
        children = []
        for _ in range(3):  # each child holds 80 MiB, under the per-process limit: 240 MiB together
            ready, held = os.pipe()
            pid = os.fork()
            if pid == 0:
                data = b"x" * (80 << 20)
                os.write(held, b"1")
                time.sleep(30)
                os._exit(0)
            os.close(held)
            os.read(ready, 1)
            children.append(pid)
        killed = 0
        for pid in children:
            os.kill(pid, signal.SIGTERM)
            killed += os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == -signal.SIGKILL
        print(killed)
    """))
    assert result.exit_code == 0, result
    assert int(result.stdout) >= 2  # the kernel's OOM killer took the older ones
    assert result.oom_killed is True


async def test_a_sandbox_that_cannot_start_is_unavailable_not_the_scripts_exit_code(
    make_settings: MakeSettings, tmp_path: Path
) -> None:
    (tmp_path / "bwrap").symlink_to("/usr/bin/bwrap")
    sandbox = await LocalBackend.create(settings=make_settings(), search_path=str(tmp_path))
    (tmp_path / "bwrap").unlink()  # bubblewrap went away (an upgrade, a cleanup) after the manager started
    with pytest.raises(SandboxUnavailable, match="sandbox"):
        await sandbox.run(job("print('never runs')"))


_DRIVER = """
import asyncio, sys
from rockbot.scripts_manager.backends import ScriptJob
from rockbot.scripts_manager.backends.local import LocalBackend
from rockbot.scripts_manager.settings import ScriptsManagerSettings

async def main():
    backend = await LocalBackend.create(settings=ScriptsManagerSettings(scripts_backend="local"))
    await backend.run(ScriptJob(
        request_id="r", script="import time; time.sleep(60)", input_data=sys.argv[1], timeout_seconds=60
    ))

asyncio.run(main())
"""


async def test_job_files_are_private_and_a_killed_managers_are_removed_by_the_next(
    make_settings: MakeSettings, shared_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    jobs = shared_tmp  # the manager's $TMPDIR
    secret = f"input-{uuid.uuid4().hex}"
    manager = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _DRIVER, secret, env={**os.environ, "TMPDIR": str(jobs), "PYTHONSAFEPATH": "1"},
        start_new_session=True,
    )  # fmt: skip
    cgroups = MemoryCgroups.find()
    try:

        async def job_running() -> Path:
            """The job's folder once the job runs: in its memory cgroup, where the manager makes one (it writes the
            folder first, so killing the manager as soon as the folder shows would leave no cgroup to check)."""
            assert manager.returncode is None, f"the manager exited with {manager.returncode}"
            written = [d for d in jobs.iterdir() if _text(d / "input") == secret]
            assert len(written) == 1
            assert cgroups is None or _text(cgroups.base / written[0].name / "cgroup.procs")
            return written[0]

        # A fresh interpreter imports rockbot and probes its sandbox first: slow on a loaded machine.
        job_dir = await eventually(job_running, within=90)
        if os.geteuid() == 0:  # another local user tries to read it
            peek = await asyncio.create_subprocess_exec(
                "setpriv", "--reuid=12345", "--regid=12345", "--clear-groups", "--", "cat", str(job_dir / "input"),
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            )  # fmt: skip
            seen, _ = await peek.communicate()
            assert secret.encode() not in seen and peek.returncode != 0
        # Only the script's own group (nobody's, under a root manager) may pass through it, to /input and /output.
        mode = job_dir.stat()
        assert mode.st_mode & 0o077 == 0 or (mode.st_mode & 0o077 == 0o010 and mode.st_gid == 65534)
        assert (job_dir / "input").stat().st_mode & 0o077 == 0
    finally:
        os.killpg(manager.pid, signal.SIGKILL)
        await manager.wait()
    assert job_dir.exists()  # a SIGKILLed manager cleans nothing up
    assert cgroups is None or (cgroups.base / job_dir.name).exists()
    monkeypatch.setattr(tempfile, "tempdir", str(jobs))
    await LocalBackend.create(settings=make_settings())
    assert not job_dir.exists()
    assert cgroups is None or not (cgroups.base / job_dir.name).exists()


def _text(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


async def test_a_package_cache_others_can_write_is_refused_before_anything_is_imported_from_it(
    make_settings: MakeSettings, tmp_path: Path, shared_tmp: Path
) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _make_wheel(wheels, name="rockbot_demo_pkg", version="1.0", module="rockbot_demo", source="ANSWER = 42\n")
    cache = shared_tmp / "rockbot-packages"  # like /tmp/rockbot-packages: a name anyone can take first
    cache.mkdir()
    cache.chmod(0o777)
    settings = make_settings(
        scripts_allowed_packages=["rockbot-demo-pkg"], scripts_pip_find_links=str(wheels), scripts_package_cache=cache
    )
    try:
        sandbox = await LocalBackend.create(settings=settings)
    except SandboxUnavailable as refused:
        assert f"ROCKBOT_SCRIPTS_PACKAGE_CACHE={cache}" in str(refused) and "writable by others" in str(refused)
        return
    planted = sandbox._packages.path_for(("rockbot-demo-pkg",))  # type: ignore[union-attr]  # the name is predictable
    planted.mkdir(parents=True)
    (planted / "rockbot_demo.py").write_text("ANSWER = 'planted'\n")
    result = await sandbox.run(job("import rockbot_demo; print(rockbot_demo.ANSWER)", packages=("rockbot-demo-pkg",)))
    assert "planted" not in result.stdout, result
