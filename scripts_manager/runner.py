"""Runs inside a script pod as its only process (PID 1; standard library only): one job, then exit.

The pod starts it with stdin held open (`stdin`, `stdinOnce`); the scripts-manager attaches and
writes one JSON line, the job: the script, its input, its timeout, the output cap and a `nonce`, a
secret made for this run. The runner starts the script as a child, reads the child's stdout and
stderr apart (keeping the first `max_output_bytes` of each, draining the rest), enforces the timeout
on the child's whole process group, and prints two JSON lines on its own stdout, each carrying the
nonce: one when the script has started, one with the result (both streams, the exit code, whether
the memory limit killed the script, from the container cgroup's `memory.events`).

Why the script cannot forge the result: its stdout and stderr are pipes to this runner, never the
container's own streams. It runs as the same user, so the runner first makes itself non-dumpable
(`prctl(PR_SET_DUMPABLE, 0)`): without CAP_SYS_PTRACE (script pods drop every capability) no other
process may open `/proc/1/fd/*`, `/proc/1/mem` or `/proc/1/environ`, or ptrace the runner. So the
script can neither write to the stream the manager reads nor learn the nonce, which only ever
travelled on the runner's stdin; the manager accepts only lines with the nonce. The job is never
written to disk with the nonce, and the script gets a fresh stdin holding only its input.
"""

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

STARTED_KEY = "rockbot_script_started"
RESULT_KEY = "rockbot_script_result"
#: Script and input are at most 2 MiB together (the manager's settings), six times that as JSON at worst.
MAX_JOB_BYTES = 16 * 1024 * 1024
_PR_SET_DUMPABLE = 4
_MEMORY_EVENTS = "/sys/fs/cgroup/memory.events"


def _refuse_ptrace():
    """Make this process non-dumpable, or fail: without it the script could write as the runner."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")


def _oom_kills():
    try:
        with open(_MEMORY_EVENTS) as events:
            for line in events:
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
    except OSError:
        pass
    return 0


def _capture(stream, cap, into):
    """Fill `into` as data comes, so what was read is there even if something keeps the pipe open."""
    while True:
        chunk = stream.read1(65536)
        if not chunk:
            break
        room = cap - len(into["kept"])
        if room > 0:
            into["kept"] += chunk[:room]
        into["truncated"] = into["truncated"] or len(chunk) > room


def _say(**fields):
    sys.stdout.write("\n" + json.dumps(fields) + "\n")
    sys.stdout.flush()


def _read_job():
    line = sys.stdin.buffer.readline(MAX_JOB_BYTES + 1)
    if not line.endswith(b"\n"):
        raise ValueError(f"no job line on stdin ({len(line)} bytes before the end)")
    job = json.loads(line)
    if not isinstance(job, dict) or not isinstance(job.get("nonce"), str) or len(job["nonce"]) < 16:
        raise ValueError("the job has no nonce")
    return job


def _run(job, workdir):
    cap = int(job["max_output_bytes"])
    script = os.path.join(workdir, "script.py")
    with open(script, "w") as source:
        source.write(job["script"])
    with open(os.path.join(workdir, "input"), "w") as data:
        data.write(job.get("input") or "")
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "TMPDIR": "/tmp", "LANG": "C.UTF-8",
           "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    oom_before = _oom_kills()
    started = time.monotonic()
    with open(os.path.join(workdir, "input"), "rb") as stdin:
        child = subprocess.Popen(
            [sys.executable, "-s", script], stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            cwd="/tmp", env=env, start_new_session=True,
        )
    _say(**{STARTED_KEY: job["nonce"]})
    out = {"kept": bytearray(), "truncated": False}
    err = {"kept": bytearray(), "truncated": False}
    readers = [threading.Thread(target=_capture, args=(child.stdout, cap, out), daemon=True),
               threading.Thread(target=_capture, args=(child.stderr, cap, err), daemon=True)]
    for reader in readers:
        reader.start()
    timed_out = False
    try:
        child.wait(timeout=float(job["timeout_seconds"]))
    except subprocess.TimeoutExpired:
        timed_out = True
    with contextlib.suppress(OSError):
        os.killpg(child.pid, signal.SIGKILL)
    child.wait()
    duration = time.monotonic() - started
    for reader in readers:
        reader.join(timeout=2)
    code = child.returncode
    return {
        "stdout": bytes(out["kept"]).decode(errors="replace"),
        "stderr": bytes(err["kept"]).decode(errors="replace"),
        "exit_code": None if timed_out else (128 - code if code < 0 else code),
        "timed_out": timed_out,
        "oom_killed": _oom_kills() > oom_before,
        "output_truncated": out["truncated"] or err["truncated"],
        "duration_seconds": round(duration, 4),
    }


def main():
    _refuse_ptrace()
    signal.signal(signal.SIGINT, lambda *_: None)  # a script's ^C to PID 1 is not the runner's end
    try:
        job = _read_job()
    except ValueError as exc:
        print(f"rockbot runner: {exc}", file=sys.stderr)
        return 65
    with tempfile.TemporaryDirectory(prefix="rockbot-job-") as workdir:
        result = _run(job, workdir)
    _say(**{RESULT_KEY: job["nonce"]}, **result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
