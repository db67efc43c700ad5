"""Issue 31 §5: a script in the local sandbox (bubblewrap) can trace no process there but its own children; the
sandbox's PID 1 is the script itself, not a process of bubblewrap's it could take over."""

from __future__ import annotations

from rockbot.scripts_manager.backends.local import LocalBackend
from tests.scripts_manager.conftest import MakeSettings
from tests.scripts_manager.test_local_sandbox import job

_TRACE_EVERY_OTHER_PROCESS = """
    import ctypes, os
    libc = ctypes.CDLL(None, use_errno=True)
    PTRACE_ATTACH, PTRACE_DETACH = 16, 17
    mine = os.getpid()
    for pid in sorted(int(name) for name in os.listdir("/proc") if name.isdigit() and int(name) != mine):
        if libc.ptrace(PTRACE_ATTACH, pid, None, None) == 0:
            print("traced", pid, open(f"/proc/{pid}/cmdline", "rb").read())
            os.waitpid(pid, 0)
            libc.ptrace(PTRACE_DETACH, pid, None, None)
        else:
            print("refused", pid, os.strerror(ctypes.get_errno()))
    print("I am", mine)
"""


async def test_a_script_cannot_trace_the_sandboxs_pid_1_or_any_process_it_did_not_start(
    make_settings: MakeSettings,
) -> None:
    sandbox = await LocalBackend.create(settings=make_settings(scripts_local_isolation="bwrap"))
    result = await sandbox.run(job(_TRACE_EVERY_OTHER_PROCESS))
    assert result.exit_code == 0, result
    assert "traced" not in result.stdout, result.stdout
    assert result.stdout.splitlines()[-1] == "I am 1"  # PID 1 is the script: nothing else of the sandbox's runs
