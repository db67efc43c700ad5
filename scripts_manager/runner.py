"""Runs inside a script pod (standard library only): the script as a child, both streams captured.

The pod's log merges stdout and stderr, so the script never writes to it directly: this runner
reads the script's two pipes separately (keeping the first `max_output_bytes` of each and
draining the rest), enforces the timeout on the script's whole process group, and then prints
exactly one JSON line with both streams, the exit code and whether the memory limit killed the
script (from the container cgroup's `memory.events`). Usage: `python3 runner.py JOB_DIR`, where
JOB_DIR (the ConfigMap volume) holds script.py, input and job.json.
"""

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time

RESULT_KEY = "rockbot_script_result"
_MEMORY_EVENTS = "/sys/fs/cgroup/memory.events"


def _oom_kills() -> int:
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


def main(job_dir):
    with open(os.path.join(job_dir, "job.json")) as spec:
        job = json.load(spec)
    cap = int(job["max_output_bytes"])
    oom_before = _oom_kills()
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "TMPDIR": "/tmp", "LANG": "C.UTF-8",
           "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    started = time.monotonic()
    with open(os.path.join(job_dir, "input"), "rb") as stdin:
        child = subprocess.Popen(
            [sys.executable, "-s", os.path.join(job_dir, "script.py")], stdin=stdin,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd="/tmp", env=env, start_new_session=True,
        )
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
    result = {
        RESULT_KEY: 1,
        "stdout": bytes(out["kept"]).decode(errors="replace"),
        "stderr": bytes(err["kept"]).decode(errors="replace"),
        "exit_code": None if timed_out else (128 - code if code < 0 else code),
        "timed_out": timed_out,
        "oom_killed": _oom_kills() > oom_before,
        "output_truncated": out["truncated"] or err["truncated"],
        "duration_seconds": round(duration, 4),
    }
    sys.stdout.write("\n" + json.dumps(result) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
