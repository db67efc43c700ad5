"""A session's interpreter, as a notebook kernel: runs each call's script in one `__main__`, so globals stay.

Runs inside the sandbox (standard library only). Started with no argument it is the sandbox's PID 1, a
supervisor: it makes itself non-dumpable (the script, the same user, can then neither trace it nor read its
memory), starts the kernel as its child and exits with the kernel's status, which ends the sandbox's PID
namespace and everything left in it. A kernel killed by a script (`os.kill(os.getpid(), SIGKILL)`), by the
memory limit or by its own `os._exit` thus ends the session, and the manager sees how it ended; PID 1 itself
would ignore a SIGKILL sent from inside.

The kernel reads one JSON line per call on its stdin (blank lines, keepalives, are skipped): the script, its input
and a marker. It runs the script with `sys.stdin` reading the input, then writes the marker on stderr and the
marker plus a JSON line (the exit code) on stdout, which tells the manager the call's output is complete.
`sys.exit(n)` in a script ends the call with exit code n and keeps the session; an uncaught exception prints its
traceback and gives exit code 1; an uncaught MemoryError ends the session (exit 137, as an OOM kill would), since
the interpreter may be left half-changed. The script runs in the kernel's process, so it could write a marker
itself: that only confuses its own session's answers, never another's (a session is one conversation's, in a
sandbox of its own).
"""

import contextlib
import ctypes
import io
import json
import os
import signal
import sys
import traceback
import types

_PR_SET_DUMPABLE = 4
_OOM_EXIT = 137


def supervise() -> int:
    """PID 1: start the kernel, then reap whatever ends, until the kernel does; its status is the sandbox's."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")
    kernel = os.fork()
    if kernel == 0:
        try:
            os.execv(sys.executable, [sys.executable, "-s", os.path.abspath(__file__), "kernel"])
        finally:
            os._exit(127)
    os.close(0)  # the calls are the kernel's to read
    while True:
        pid, status = os.wait()
        if pid == kernel:
            code = os.waitstatus_to_exitcode(status)
            return 128 - code if code < 0 else code


def serve() -> int:
    """The kernel: one call per line on stdin, until it closes."""
    calls = os.fdopen(os.dup(0), "rb")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)  # what the script starts reads nothing of the calls
    os.close(null)
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = __builtins__
    sys.modules["__main__"] = main
    sys.path[0] = os.getcwd()
    number = 0
    while line := calls.readline():
        if not line.strip():  # a keepalive of the stream the calls come on (the pod backend's attach session)
            continue
        number += 1
        call = json.loads(line)
        sys.stdin = io.StringIO(call.get("input") or "")
        code = _run(call["script"], f"<script {number}>", main.__dict__)
        for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
            with contextlib.suppress(AttributeError, OSError, ValueError):
                stream.flush()
        marker = call["marker"].encode()
        os.write(2, marker)
        os.write(1, marker + json.dumps({"exit_code": code}).encode() + b"\n")
    return 0


def _run(script: str, name: str, scope: dict) -> int:
    try:
        exec(compile(script, name, "exec"), scope)  # the sandbox is the boundary, not this process
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    except BaseException as exc:  # a script's every failure is its call's result
        traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next)
        if isinstance(exc, MemoryError):
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGKILL)
            os._exit(_OOM_EXIT)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(serve() if sys.argv[1:] == ["kernel"] else supervise())
