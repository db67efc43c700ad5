"""Writing the conversation's files under `/input` inside a script pod, from raw bytes that follow a line on stdin.

Standard library only and without module-level imports, as output_walk.py and for the same reason: one copy serves
two writers inside a pod. A single script's runner carries this source before its own (pod_manifests.RUNNER) and
writes a job's files before the script exists; a session's kernel carries it too (sessions.KERNEL) and writes the
files a later call brings (a file the conversation gained, or changed, since the session's last call) before that
call's script runs, and removes those the call no longer names, so that `/input` holds the call's files as in the
local backend.

The files are written read-only (files 0444, the folders made for them 0555: a write fails with EACCES). /input
itself is the kubelet's emptyDir (root's, mode 0777), which no pod user may chmod, so a script can add new names
beside them; and it runs as the writer's user, so the copies are its own to chmod: never the stored files, never
another call's. Every byte a line names is read from the stream even when a file cannot be written, so that the
stream's next line is where its writer put it.
"""


def write_inputs(stream, folder, named, removed=()):
    """Remove the `removed` names under `folder`, then write each `(name, size)` of `named` there from `stream`'s
    next `size` bytes (a file of that name is replaced); the problems, one sentence each (empty: all written).
    ValueError when the stream ends inside a file."""
    import os

    problems, made, opened = [], [], []

    def parts_of(name):
        parts = str(name).split("/")
        if str(name).startswith("/") or any(part in ("", ".", "..") for part in parts):
            return None
        return parts

    def open_up(path):
        if path != folder and path not in opened and os.path.isdir(path):
            os.chmod(path, 0o755)
            opened.append(path)

    for name in removed:
        parts = parts_of(name)
        if parts is None:
            continue
        parent = os.path.join(folder, *parts[:-1])
        try:
            open_up(parent)
            os.unlink(os.path.join(parent, parts[-1]))
        except FileNotFoundError:
            pass
        except OSError as exc:
            problems.append(f"{folder}/{name} could not be removed: {exc.strerror}")
    for name, size in named:
        left, parts, fd = int(size), parts_of(name), None
        if parts is None or left < 0:
            raise ValueError(f"the input file name {name!r} is not a relative path")
        try:
            path = folder
            for part in parts[:-1]:
                path = os.path.join(path, part)
                if not os.path.isdir(path):
                    os.mkdir(path, 0o755)  # made here, in the order of names: a folder before what it holds
                    made.append(path)
                else:
                    open_up(path)
            target = os.path.join(path, parts[-1])
            if os.path.lexists(target):
                open_up(path)
                os.unlink(target)
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o444)
        except OSError as exc:
            problems.append(f"{folder}/{name} could not be written: {exc.strerror}")
        try:
            while left:
                chunk = stream.read(min(left, 1024 * 1024))
                if not chunk:
                    raise ValueError(f"stdin ended inside the input file {name!r}")
                left -= len(chunk)
                view = memoryview(chunk)
                try:
                    while fd is not None and view:
                        view = view[os.write(fd, view):]
                except OSError as exc:  # say so, and read on to the file's end
                    problems.append(f"{folder}/{name} could not be written: {exc.strerror}")
                    os.close(fd)
                    fd = None
        finally:
            if fd is not None:
                os.close(fd)
    for path in reversed(made + opened):
        try:  # noqa: SIM105 (no module-level imports here: see above)
            os.chmod(path, 0o555)
        except OSError:
            pass
    return problems
