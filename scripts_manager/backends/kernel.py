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

In a pod (pod_sessions.py) the kernel also moves the call's files, with the code a single script's runner uses (its
source, output_walk.py and input_write.py, comes before this one: sessions.KERNEL): the files the call brings follow
its line as raw bytes and are written under /input (`write_inputs`), those it no longer names are removed; /output is
emptied before the script runs and read after it (`walk_output`, within the call's `output_bounds`), and its files go
in the JSON line after the marker (`say_output`), so that a call gives back what it wrote, never an earlier call's
files. The local backend does the same on the manager's side (local_sessions.py) and sends neither.
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
    sys.path.insert(0, os.getcwd())  # before the kernel's own folder, where a pod's figures module is
    folders = os.environ.get("ROCKBOT_INPUT_DIR", "/input"), os.environ.get("ROCKBOT_OUTPUT_DIR", "/output")
    number = 0
    while line := calls.readline():
        if not line.strip():  # a keepalive of the stream the calls come on (the pod backend's attach session)
            continue
        number += 1
        call = json.loads(line)
        problems = _take_inputs(calls, folders[0], call)
        bounds = call.get("output_bounds")
        if bounds:
            _empty(folders[1])
        print(*problems, sep="\n", file=sys.stderr, end="\n" if problems else "")
        sys.stdin = io.StringIO(call.get("input") or "")
        code = _run(call["script"], f"<script {number}>", main.__dict__)
        for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
            with contextlib.suppress(AttributeError, OSError, ValueError):
                stream.flush()
        marker = call["marker"].encode()
        os.write(2, marker)
        if bounds:
            say_output(1, marker, {"exit_code": code}, *_output(folders[1], bounds))  # noqa: F821 (output_walk.py)
        else:
            os.write(1, marker + json.dumps({"exit_code": code}).encode() + b"\n")
    return 0


def _take_inputs(calls: io.BufferedReader, folder: str, call: dict) -> list[str]:
    """Write the files that follow the call's line under /input, and remove those it no longer names (a pod's)."""
    if not call.get("input_files") and not call.get("input_removed"):
        return []
    return write_inputs(calls, folder, call.get("input_files") or [], call.get("input_removed") or [])  # noqa: F821


def _empty(folder: str) -> None:
    """Remove what the last call left under /output (the script's own: folders it closed are opened first, and no
    link is followed)."""
    for parent, names, _ in os.walk(folder):
        for name in names:
            with contextlib.suppress(OSError):
                if not os.path.islink(path := os.path.join(parent, name)):
                    os.chmod(path, 0o700)
    for parent, names, files in os.walk(folder, topdown=False):
        for name in files + names:
            path = os.path.join(parent, name)
            with contextlib.suppress(OSError):
                if os.path.isdir(path) and not os.path.islink(path):
                    os.rmdir(path)
                else:
                    os.unlink(path)


def _output(folder: str, bounds: list[int]) -> tuple[list, list[str]]:
    """What the call left under /output within its bounds, and what was left out (`walk_output`)."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as exc:
        return [], [f"{folder} could not be read: {exc.strerror}"]
    try:
        return walk_output(fd, *(int(bound) for bound in bounds))  # noqa: F821 (output_walk.py, see above)
    finally:
        os.close(fd)


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
