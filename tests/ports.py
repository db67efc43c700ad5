"""Ports for the servers the tests start, which nothing else on the machine is given meanwhile.

A port the system hands out for `bind(("127.0.0.1", 0))` is an ephemeral one: between the draw and the
server's own bind (a broker's ports are drawn when its fixture is made and bound when a test starts it)
another xdist worker may draw the same one, and any outgoing connection of the machine may take it as its
local port. So each worker draws from a share of its own of a range below the system's ephemeral ports
(`ip_local_port_range`), one after another, skipping any port something is bound to.
"""

from __future__ import annotations

import itertools
import os
import random
import socket
from pathlib import Path

#: Where the shares begin: above the ports `../shared/k8s` fixes for its rig (10250-18999).
FIRST_PORT = 20000


def _ephemeral_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def _share() -> range:
    """This worker's ports: its slice of FIRST_PORT up to the ephemeral range."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
    size = (_ephemeral_start() - FIRST_PORT) // max(workers, 1)
    if size < 100:
        return range(0)  # the system's ephemeral range starts too low for shares: draw from it
    start = FIRST_PORT + worker * size
    return range(start, start + size)


_SHARE = _share()
_START = random.randrange(len(_SHARE)) if _SHARE else 0
#: Each port of the share in turn, from a random point (a run just before may have left ports in TIME_WAIT);
#: 0 (any ephemeral port) when there is no share.
_NEXT = itertools.cycle([*_SHARE[_START:], *_SHARE[:_START]] or [0])


def free_port() -> int:
    """A port on 127.0.0.1 that nothing is bound to and that no other worker will be given."""
    for _ in range(max(len(_SHARE), 1)):
        candidate = next(_NEXT)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", candidate))
            except OSError:
                continue
            return sock.getsockname()[1]
    raise RuntimeError(f"no free port left in this worker's share {_SHARE}")
