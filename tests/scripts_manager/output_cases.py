"""What hostile scripts leave under /output, as both backends (local sandbox, script pods) must bring it back or
refuse it (issue 35): the scripts and the names they must have dropped, shared by test_local_files.py and
test_pod_files.py. A fragment is unindented Python, to be joined with a test's own lines."""

from __future__ import annotations

import base64
import textwrap
import uuid

import pytest

from rockbot.contracts.scripts import ScriptInvokeResponse
from rockbot.scripts_manager.backends import InputFile, ScriptBackend, ScriptJob
from rockbot.scripts_manager.backends.outputs import OutputBounds

PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="
)
LINKED = "(only files written under /output come back)"
#: Links out of /output (a symbolic one to /etc/passwd, a hard one across devices, refused), a hard link within
#: it and a FIFO: none comes back. Prints "cross-device 18".
LINKS = """
import os
os.symlink("/etc/passwd", "/output/passwd")
open("/tmp/secret", "w").write("from tmp")
try:
    os.link("/tmp/secret", "/output/hard")
except OSError as exc:
    print("cross-device", exc.errno)
open("/output/own", "w").write("mine")
os.link("/output/own", "/output/twin")
os.mkfifo("/output/fifo")
"""
LINKS_DROPPED = [f"fifo: not a regular file {LINKED}", f"own: a hard link {LINKED}",
                 f"passwd: a symbolic link {LINKED}", f"twin: a hard link {LINKED}"]  # fmt: skip
#: Names a terminal or a log would misread: dropped, and said with their odd characters replaced.
ODD_NAMES = r"""
open("/output/bad\x1b[31mname\n.txt", "w").write("x")
open(b"/output/not-utf8-\xff.txt", "w").write("x")
"""
ODD_NAMES_DROPPED = ["bad?[31mname?.txt: the name holds control characters", "not-utf8-?.txt: the name is not UTF-8"]
#: Files whose name claims an image: only real raster images are typed as images (an SVG may hold a script).
FAKE_IMAGES = """
open("/output/fake.png", "w").write("<html><script>alert(1)</script></html>")
open("/output/chart.svg", "w").write('<svg xmlns="http://www.w3.org/2000/svg"><script>alert(1)</script></svg>')
"""
FAKE_IMAGES_TYPED = {"fake.png": "application/octet-stream", "chart.svg": "image/svg+xml"}
#: More files than any bound lets back.
TINY_FILES = """
for n in range(10_000):
    open(f"/output/f{n:05}.txt", "w").write(str(n))
"""


def job(script: str, *, files: tuple[InputFile, ...] = (), bounds: OutputBounds | None = None,
        memory: str | None = None) -> ScriptJob:  # fmt: skip
    return ScriptJob(
        request_id=uuid.uuid4().hex, script=textwrap.dedent(script), input_data=None, timeout_seconds=30.0,
        files=files, output_bounds=bounds or OutputBounds(), memory=memory,
    )  # fmt: skip


def named(result: ScriptInvokeResponse) -> dict[str, bytes]:
    return {artifact.name: artifact.content for artifact in result.artifacts}


async def require_matplotlib(backend: ScriptBackend, *, python: str) -> None:
    """Fail, naming the fix, when `python` (whose Python the backend's scripts run) has no matplotlib."""
    probe = await backend.run(job("import matplotlib", memory="1Gi"))  # numpy's BLAS threads reserve address space
    if probe.exit_code != 0:
        pytest.fail(f"{python} has no matplotlib ({probe.stderr.strip()[-200:]}): install it, e.g. "
                    "apt-get install -y python3-matplotlib")
