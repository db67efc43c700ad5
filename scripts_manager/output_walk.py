"""Reading what a script left under `/output` as a hostile folder: the files within bounds, and what was left out.

Standard library only and without module-level imports, because one copy of this code serves both sandboxes: the
local backend calls it on the manager's side (backends/outputs.py), and a script pod's runner carries this file's
source before its own (pod_manifests.RUNNER) and calls it inside the pod once the script has ended, so that what
comes back over the attach stream was already chosen by these rules.

The folder is the script's: every name in it, every kind of entry and every size was chosen by it. So it is walked
by descriptor (`dir_fd`, `O_NOFOLLOW`), never by path: a symlink is never followed and is dropped, anything but a
regular file or folder is dropped, a file with more than one link (a hard link to something elsewhere) is dropped,
and a name with control characters, or one that is not UTF-8, is dropped. Names come back as relative paths
(`charts/a.png`); they are labels for people and the model, never paths on any host. At most `MAX_ENTRIES` entries
are looked at, so a script that leaves 10,000,000 files costs a bounded walk.

Bounds: `files` files, `file_bytes` each, `total_bytes` together; a file over a bound is dropped, and every drop is
said (a sentence per file, the rest counted), never silently.

Inside a pod, what was kept goes back on the pod's stdout as one JSON line (`say_output`): the runner's result for a
single script, a session kernel's trailer for each call (kernel.py), which the manager reads with
`backends.outputs.received`.
"""

#: Entries (files and folders) looked at in one output folder at most.
MAX_ENTRIES = 100_000
#: How deep folders under `/output` are walked.
MAX_DEPTH = 8
#: Drops named one by one; the rest are counted.
MAX_DROPS_NAMED = 10


def walk_output(folder_fd, files, file_bytes, total_bytes):
    """`([(name, content), ...], drops)` of the folder open as `folder_fd` (not closed here), in name order."""
    import os
    import stat

    drops, opened, found, seen = [], [], [], 0
    try:
        pending = [("", folder_fd, 0)]
        while pending:
            prefix, fd, depth = pending.pop()
            with os.scandir(fd) as entries:
                for entry in entries:
                    seen += 1
                    if seen > MAX_ENTRIES:
                        drops.append(f"more than {MAX_ENTRIES:,} entries: the rest were not looked at")
                        pending.clear()
                        break
                    name = prefix + entry.name
                    problem = _output_name_problem(entry.name)
                    if problem is not None:
                        drops.append(f"{_output_shown(name)}: {problem}")
                        continue
                    try:
                        info = os.stat(entry.name, dir_fd=fd, follow_symlinks=False)
                    except OSError:
                        drops.append(f"{name}: changed or unreadable while it was read")
                        continue
                    if stat.S_ISDIR(info.st_mode) and depth < MAX_DEPTH:
                        try:
                            inner = os.open(entry.name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
                        except OSError:
                            continue
                        opened.append(inner)
                        pending.append((name + "/", inner, depth + 1))
                    elif not stat.S_ISREG(info.st_mode):
                        kind = "a symbolic link" if stat.S_ISLNK(info.st_mode) else "not a regular file"
                        drops.append(f"{name}: {kind} (only files written under /output come back)")
                    elif info.st_nlink != 1:
                        drops.append(f"{name}: a hard link (only files written under /output come back)")
                    else:
                        found.append((name, fd, info.st_size))
        found.sort()
        kept, total = [], 0
        for name, fd, size in found:
            if len(kept) >= files:
                drops.append(f"{name}: over the bound of {files} files")
            elif size > file_bytes:
                drops.append(f"{name}: {size:,} bytes, over the bound of {file_bytes:,} bytes per file")
            elif total + size > total_bytes:
                drops.append(f"{name}: {size:,} bytes would pass the bound of {total_bytes:,} bytes per call")
            else:
                content = _output_read(fd, name.rpartition("/")[2], limit=min(file_bytes, total_bytes - total))
                if content is None:
                    drops.append(f"{name}: changed or unreadable while it was read")
                else:
                    total += len(content)
                    kept.append((name, content))
        if len(drops) > MAX_DROPS_NAMED:
            drops[MAX_DROPS_NAMED:] = [f"and {len(drops) - MAX_DROPS_NAMED:,} more files left out"]
        return kept, drops
    finally:
        for fd in opened:
            os.close(fd)


def _output_name_problem(name):
    try:
        encoded = name.encode()
    except UnicodeEncodeError:
        return "the name is not UTF-8"
    if any(not ch.isprintable() for ch in name):
        return "the name holds control characters"
    if len(encoded) > 255:
        return "the name is longer than 255 bytes"
    return None


def _output_shown(name):
    """A dropped name as it may be printed: control characters as `?`, and not too long."""
    safe = name.encode(errors="replace").decode(errors="replace")
    return "".join(ch if ch.isprintable() else "?" for ch in safe)[:80]


def _output_read(folder_fd, name, *, limit):
    """The regular file `name` in the folder, read through a descriptor that follows nothing; None if it is no longer
    one regular file of at most `limit` bytes."""
    import os
    import stat

    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=folder_fd)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1 or info.st_size > limit:
            return None
        chunks, size = [], 0
        while chunk := os.read(fd, min(1024 * 1024, limit + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                return None
        return b"".join(chunks)
    finally:
        os.close(fd)


def output_json(value):
    """One JSON value of a pod's answer line: strings, numbers, booleans, None, and dicts of them (the C encoder's
    string escaping only, so that a runner imports no json module)."""
    import _json

    if isinstance(value, str):
        return _json.encode_basestring_ascii(value)
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    if isinstance(value, dict):
        return "{" + ", ".join(f"{output_json(key)}: {output_json(item)}" for key, item in value.items()) + "}"
    return repr(value)


def say_output(fd, head, fields, files, drops):
    """Write `head`, then `fields` with the output's `files` (`walk_output`'s, emptied as written: never the whole
    line in memory) as base64 and its `drops`, as one JSON line on `fd`."""
    import binascii
    import os

    def write_all(data):
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]

    write_all(head + (output_json(fields)[:-1] + (", " if fields else "") + '"artifacts_dropped": ['
                      + ", ".join(map(output_json, drops)) + '], "artifacts": [').encode())
    for number, (name, content) in enumerate(files):
        start = (", " if number else "") + '{"name": ' + output_json(name) + ', "content": "'
        write_all(start.encode() + binascii.b2a_base64(content, newline=False) + b'"}')
        files[number] = None  # its memory goes before the next one's encoding
    write_all(b"]}\n")
