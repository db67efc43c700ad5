"""Runs inside a script pod as PID 1 (standard library only, no site-packages): one job, then exit.

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

Why a job costs no Python start: once non-dumpable, the runner starts the script's interpreter at
once, before any job exists (`python3 -s -c PRELUDE`, the same user, environment and flags a script
always had). That process has seen nothing but the prelude; it waits on a pipe of its own, and when
the job comes the runner writes the script's path there; the prelude points stdin at the job's
input and runs the script as `__main__`, as `python3 -s script.py` would (its traceback hides the
prelude's frame). One pod, one job, one such process: it is never reused.

The runner itself imports only C modules and ctypes (no json, subprocess, threading or site-packages:
about half the CPU before its first instruction, which a pod's CPU limit throttles): one thread
polls the script's two pipes and a wake-up pipe its SIGCHLD writes to.

The conversation's files follow the job line on stdin as raw bytes (the job names each one's name and size);
the runner writes them under `/input` (the pod's emptyDir) before the script starts, read-only to it.
What the script leaves under `/output` (the pod's emptyDir) comes back in the result line: once the script and
what it started are gone, the runner reads the folder with the same code as the local backend (output_walk.py, whose
source the pod's command puts before this file's) within the job's bounds, and writes each file as base64, one at a
time. The job also brings the matplotlib backend whose `plt.show()` saves figures there (backends/figures.py).

A session's pod (backends/pod_sessions.py) gets a job carrying kernel.py's source instead of a script: the
runner ends the interpreter it started, says the job started and runs kernel.py's supervisor itself (still PID 1,
non-dumpable), which starts the kernel, the one interpreter a session starts; the pod then takes the session's
calls on its stdin until the manager's attach session ends.

The result also carries when each step happened on the pod's clock (`times`, seconds since the
epoch: the runner's process start, its first instruction, the job read, the script handed over and
its end), for the manager's traces and the benchmarks' phase breakdown.
"""

import _json
import _signal
import ctypes
import os
import select
import sys
import time

STARTED_KEY = "rockbot_script_started"
RESULT_KEY = "rockbot_script_result"
#: Script and input are at most 2 MiB together (the manager's settings), six times that as JSON at worst.
MAX_JOB_BYTES = 16 * 1024 * 1024
_PR_SET_DUMPABLE = 4
_MEMORY_EVENTS = "/sys/fs/cgroup/memory.events"
JOB_DIR = "/tmp/rockbot-job"
#: The pod's emptyDir for the conversation's files, which the job brings after its line (`_receive_inputs`).
INPUT_DIR = "/input"
#: The pod's emptyDir for what the script gives back (pod_manifests), read after the script by `walk_output`.
OUTPUT_DIR = "/output"
#: The matplotlib backend whose `show` saves figures under /output (backends/figures.py): the job brings its source,
#: which the runner writes into the job's folder, the first on the script's path.
FIGURES_MODULE = "rockbot_figures"
_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "TMPDIR": "/tmp", "LANG": "C.UTF-8",
        "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1", "OPENBLAS_NUM_THREADS": "1",
        "ROCKBOT_INPUT_DIR": INPUT_DIR, "ROCKBOT_OUTPUT_DIR": OUTPUT_DIR, "MPLBACKEND": "module://" + FIGURES_MODULE}
#: How long the script's pipes are still read after it ended (something it started may hold them open).
_DRAIN_SECONDS = 2.0
#: The script's interpreter runs this first: it waits for the script's path on stdin, then makes stdin the job's
#: input and runs the script in a clean `__main__`, as `python3 -s script.py` would.
PRELUDE = r"""
import sys
def _rockbot_prepare():
    import importlib.machinery, os
    def hook(kind, value, tb, report=sys.__excepthook__):
        while tb is not None and tb.tb_frame.f_code.co_filename == "<string>":
            tb = tb.tb_next
        report(kind, value.with_traceback(tb), tb)
    chunks = []
    while chunk := os.read(0, 65536):
        chunks.append(chunk)
    path = b"".join(chunks).decode()
    if not path:  # the runner ended without a job
        raise SystemExit(0)
    data = os.open(os.path.join(os.path.dirname(path), "input"), os.O_RDONLY)
    os.dup2(data, 0)
    os.close(data)
    with open(path, "rb") as source:
        code = compile(source.read(), path, "exec")
    sys.argv[:] = [path]
    sys.path[0] = os.path.dirname(path)
    sys.excepthook = hook
    scope = sys.modules["__main__"].__dict__
    for name in [name for name in scope if name != "__builtins__"]:
        del scope[name]
    scope.update(__name__="__main__", __doc__=None, __package__=None, __spec__=None, __file__=path,
                 __cached__=None, __loader__=importlib.machinery.SourceFileLoader("__main__", path))
    return code, scope
exec(*_rockbot_prepare())
"""




class _Decoding:
    """What the C JSON scanner asks of its caller (the json module's own defaults)."""

    strict = True
    object_hook = object_pairs_hook = parse_constant = None
    parse_float, parse_int = float, int


def _refuse_ptrace():
    """Make this process non-dumpable, or fail: without it the script could write as the runner."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")


def _process_start():
    """When this process started, on the epoch clock (to the kernel's tick), or None if /proc cannot say."""
    try:
        with open("/proc/self/stat") as stat:
            ticks = int(stat.read().rpartition(")")[2].split()[19])
        return time.time() - time.clock_gettime(time.CLOCK_BOOTTIME) + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


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


def _say(**fields):
    os.write(1, ("\n" + output_json(fields) + "\n").encode())  # noqa: F821 (output_walk.py, see above)


def _output(job):
    """The files the script left under /output within the job's bounds, read by `walk_output` (its source comes
    before this one in the pod, pod_manifests.RUNNER), and what was left out."""
    bounds = job.get("output_bounds")
    if not bounds:
        return [], []
    try:
        folder = os.open(OUTPUT_DIR, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as exc:
        return [], [f"/output could not be read: {exc.strerror}"]
    try:
        return walk_output(folder, *(int(bound) for bound in bounds))  # noqa: F821 (see above)
    finally:
        os.close(folder)


def _read_job():
    line = b"\n"
    while line == b"\n":  # blank lines are a held session's keepalives (see backends/pool.py)
        line = sys.stdin.buffer.readline(MAX_JOB_BYTES + 1)
    if not line.endswith(b"\n"):
        raise ValueError(f"no job line on stdin ({len(line)} bytes before the end)")
    try:
        job, _ = _json.make_scanner(_Decoding())(line.decode(), 0)
    except (StopIteration, UnicodeDecodeError) as exc:
        raise ValueError(f"the job is not JSON: {exc}") from None
    if not isinstance(job, dict) or not isinstance(job.get("nonce"), str) or len(job["nonce"]) < 16:
        raise ValueError("the job has no nonce")
    return job


def _receive_inputs(job):
    """The conversation's files, which follow the job line on stdin as raw bytes in the order and sizes the job
    names, written under /input before the script exists, read-only, by `write_inputs` (input_write.py, whose source
    comes before this one in the pod)."""
    named = job.get("input_files") or []
    if named:
        problems = write_inputs(sys.stdin.buffer, INPUT_DIR, named)  # noqa: F821 (see above)
        if problems:
            raise ValueError(problems[0])


class _Interpreter:
    """The script's process, started before its job: waiting on its stdin for the script's path."""

    def __init__(self):
        path_read, self.path = os.pipe()
        self.stdout, out_write = os.pipe()
        self.stderr, err_write = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:  # the child: its own session, the three pipes as its streams, then Python
            try:
                os.setsid()
                for fd, target in ((path_read, 0), (out_write, 1), (err_write, 2)):
                    os.dup2(fd, target)
                os.chdir("/tmp")
                os.execve(sys.executable, [sys.executable, "-s", "-c", PRELUDE], _ENV)
            finally:
                os._exit(127)
        for fd in (path_read, out_write, err_write):
            os.close(fd)
        self.status = None

    def ended(self):
        """Whether it has ended (reaping it if so); its wait status is then in `status`."""
        if self.status is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.status = status
        return self.status is not None

    def kill(self):
        """Kill its whole session (it and what it started), ignoring what is gone already."""
        try:  # noqa: SIM105 (contextlib would cost the runner's start more than it saves here)
            os.killpg(self.pid, 9)
        except OSError:
            pass

    def wait(self):
        if self.status is None:
            self.status = os.waitpid(self.pid, 0)[1]


def _run(job, workdir, child, times, woken):
    cap = int(job["max_output_bytes"])
    script = os.path.join(workdir, "script.py")
    with open(script, "w") as source:
        source.write(job["script"])
    with open(os.path.join(workdir, "input"), "w") as data:
        data.write(job.get("input") or "")
    if job.get("figures_hook"):
        with open(os.path.join(workdir, FIGURES_MODULE + ".py"), "w") as hook:
            hook.write(job["figures_hook"])
    if child.ended():  # it died waiting (it never ran anything): a fresh one
        child = _Interpreter()
    oom_before = _oom_kills()
    started = time.monotonic()
    try:  # noqa: SIM105 (as above)
        os.write(child.path, script.encode())
    except BrokenPipeError:
        pass
    os.close(child.path)
    times["handed"] = time.time()
    _say(**{STARTED_KEY: job["nonce"]})
    kept = {child.stdout: bytearray(), child.stderr: bytearray()}
    truncated = timed_out = False
    poller = select.poll()
    for fd in (child.stdout, child.stderr, woken):
        poller.register(fd, select.POLLIN)
    open_pipes, deadline, ended_at = 2, started + float(job["timeout_seconds"]), None
    while True:
        now = time.monotonic()
        if ended_at is None and (child.ended() or now >= deadline):
            timed_out = not child.ended()
            child.kill()  # at the timeout the script; in any case what it left running, which may hold its pipes
            child.wait()
            times["exited"], ended_at = time.time(), now
        if ended_at is not None and (not open_pipes or now >= ended_at + _DRAIN_SECONDS):
            break
        limit = deadline if ended_at is None else ended_at + _DRAIN_SECONDS
        for fd, _ in poller.poll(max(limit - now, 0) * 1000):
            if fd == woken:
                os.read(woken, 4096)  # a SIGCHLD: seen at the top of the loop
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                poller.unregister(fd)
                open_pipes -= 1
                continue
            room = cap - len(kept[fd])
            kept[fd] += chunk[: max(room, 0)]
            truncated = truncated or len(chunk) > room
    duration = times["exited"] - times["handed"]
    code = os.waitstatus_to_exitcode(child.status)
    return {
        "stdout": bytes(kept[child.stdout]).decode(errors="replace"),
        "stderr": bytes(kept[child.stderr]).decode(errors="replace"),
        "exit_code": None if timed_out else (128 - code if code < 0 else code),
        "timed_out": timed_out,
        "oom_killed": _oom_kills() > oom_before,
        "output_truncated": truncated,
        "duration_seconds": round(duration, 4),
        "times": times,
    }


def _become_kernel(job, child):
    """A session's first job (pod_sessions.py): this pod keeps an interpreter for its conversation's calls.

    The job carries kernel.py's source; the interpreter started for a single script is ended, the runner says the
    job started, then is the kernel's supervisor itself (kernel.py's `supervise`, run here: still PID 1 and
    non-dumpable, with no interpreter start of its own), whose child, the kernel, reads the session's calls on the
    pod's stdin and writes on its stdout and stderr. Returns the kernel's exit status, the pod's.
    """
    os.close(child.path)  # it reads no path: it exits, if still waiting
    try:  # noqa: SIM105 (as in _Interpreter.kill)
        os.kill(child.pid, 9)  # its own pid, not its group: it may not have made its session yet
    except OSError:
        pass
    child.wait()
    path = os.path.join(JOB_DIR, "kernel.py")
    with open(path, "w") as source:
        source.write(job["kernel"])
    if job.get("figures_hook"):  # beside the kernel, on its path: `plt.show()` saves under /output
        with open(os.path.join(JOB_DIR, FIGURES_MODULE + ".py"), "w") as hook:
            hook.write(job["figures_hook"])
    _signal.set_wakeup_fd(-1)
    _signal.signal(_signal.SIGCHLD, _signal.SIG_DFL)
    os.environ.clear()  # what the kernel starts with: a script's environment
    os.environ.update(_ENV if job.get("figures_hook") else {k: v for k, v in _ENV.items() if k != "MPLBACKEND"})
    os.chdir("/tmp")
    kernel = {"__name__": "rockbot_kernel", "__file__": path}
    exec(compile(job["kernel"], path, "exec"), kernel)  # its definitions only (it runs as __main__ elsewhere)
    _say(**{STARTED_KEY: job["nonce"]})
    return kernel["supervise"]()


def main():
    _refuse_ptrace()
    times = {"process": _process_start(), "main": time.time()}
    _signal.signal(_signal.SIGINT, lambda *_: None)  # a script's ^C to PID 1 is not the runner's end
    woken, wake = os.pipe()  # SIGCHLD writes a byte here, so the poll wakes when the script ends
    os.set_blocking(wake, False)
    _signal.set_wakeup_fd(wake)
    _signal.signal(_signal.SIGCHLD, lambda *_: None)
    child = _Interpreter()
    try:
        job = _read_job()
        _receive_inputs(job)
    except (ValueError, OSError) as exc:
        print(f"rockbot runner: {exc}", file=sys.stderr)
        return 65
    times["job"] = time.time()
    os.mkdir(JOB_DIR, 0o700)  # the pod's own /tmp, which held nothing before this one job (left for the pod's end)
    if isinstance(job.get("kernel"), str):
        return _become_kernel(job, child)
    result = _run(job, JOB_DIR, child, times, woken)
    files, drops = _output(job)
    say_output(1, b"\n", {RESULT_KEY: job["nonce"], **result}, files, drops)  # noqa: F821 (see above)
    return 0


if __name__ == "__main__":
    sys.exit(main())
