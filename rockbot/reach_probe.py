"""The isolation canary's program (standard library only): try each target, print which were reached.

It runs where a script or an agent would (a pod made like theirs, or the local sandbox), so what it
reaches is what they can reach. Targets come as a JSON list of URIs on the command line, or in a
JSON object `{"targets": [...], "timeout_seconds": N}` on stdin (the way a script gets its input):
- `tcp://HOST:PORT`: reached when a TCP handshake completes (a refusal or a reset is not reached:
  some policy engines reject instead of dropping);
- `dns:NAME`: a DNS query for NAME to the first `nameserver` of /etc/resolv.conf (the cluster DNS in
  a pod), reached when any answer comes back (even "no such name": the server was reached);
- `dns://SERVER:PORT/NAME`: the same query to that server.
Every target is tried at once, each in a thread bounded by the timeout, so a dropped packet costs
one timeout, not one per target. The answer is one JSON line with RESULT_KEY.
"""

import json
import os
import random
import socket
import struct
import sys
import threading
import urllib.parse

RESULT_KEY = "rockbot_reachability"
RESOLV_CONF = "/etc/resolv.conf"


def _tcp(host, port, timeout):
    with socket.create_connection((host, port), timeout=timeout):
        return "connected"


def _nameserver():
    try:
        with open(RESOLV_CONF) as conf:
            for line in conf:
                parts = line.split()
                if len(parts) >= 2 and parts[0] == "nameserver":
                    return parts[1]
    except OSError as exc:
        raise OSError(f"no resolver: {exc}") from None
    raise OSError(f"no nameserver in {RESOLV_CONF}")


def _dns(server, port, name, timeout):
    ident = random.randrange(1 << 16)
    question = b"".join(bytes([len(label)]) + label.encode() for label in name.strip(".").split(".")) + b"\0"
    query = struct.pack("!HHHHHH", ident, 0x0100, 1, 0, 0, 0) + question + struct.pack("!HH", 1, 1)
    family = socket.AF_INET6 if ":" in server else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as sock:
        sock.settimeout(timeout)
        sock.connect((server, port))
        sock.send(query)
        while True:
            answer = sock.recv(4096)
            if len(answer) >= 4 and struct.unpack("!H", answer[:2])[0] == ident:
                return f"answered (rcode {answer[3] & 0x0F})"


def probe(target, timeout):
    """What reaching `target` gave (it was reached); an exception says why it was not."""
    uri = urllib.parse.urlsplit(target)
    if uri.scheme == "tcp" and uri.hostname and uri.port:
        return _tcp(uri.hostname, uri.port, timeout)
    if uri.scheme == "dns" and uri.netloc:
        return _dns(uri.hostname, uri.port or 53, uri.path.lstrip("/"), timeout)
    if uri.scheme == "dns" and uri.path:
        return _dns(_nameserver(), 53, uri.path, timeout)
    raise ValueError("not tcp://HOST:PORT, dns:NAME or dns://SERVER:PORT/NAME")


def probe_all(targets, timeout):
    results = {target: {"target": target, "reached": False, "detail": f"no answer within {timeout:g} s"}
               for target in targets}

    def one(target):
        try:
            results[target] = {"target": target, "reached": True, "detail": probe(target, timeout)}
        except (OSError, ValueError, UnicodeError) as exc:
            results[target] = {"target": target, "reached": False, "detail": f"{type(exc).__name__}: {exc}"}

    threads = [threading.Thread(target=one, args=(target,), daemon=True) for target in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout + 1)
    return [results[target] for target in targets]


def main():
    if len(sys.argv) > 1:
        targets, timeout = json.loads(sys.argv[1]), float(sys.argv[2]) if len(sys.argv) > 2 else 3.0
    else:
        job = json.loads(sys.stdin.read())
        targets, timeout = job["targets"], float(job.get("timeout_seconds", 3.0))
    results = probe_all(list(dict.fromkeys(targets)), timeout)
    line = json.dumps({RESULT_KEY: results})
    print(line, flush=True)
    try:  # a pod's termination message: its reader needs no right to read logs
        with open("/dev/termination-log", "w") as message:
            message.write(line)
    except OSError:
        pass
    os._exit(0)  # threads still waiting on a dropped packet must not hold the exit


if __name__ == "__main__":
    main()
