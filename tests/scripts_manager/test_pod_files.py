"""A script pod's `/input` and `/output`: the conversation's files in, read-only, and what the script leaves come
back as artifacts, hostile folders included (issue 35).

The node runs the pod's own command, the real runner, as a restricted pod runs it (read-only root, the pod's
emptyDirs at /tmp and /output, uid 65534, no network); the runner reads /output with the local backend's code
(output_walk.py) and the manager checks what it sent once more (backends/outputs.py).
"""

from __future__ import annotations

import base64
import random
from collections.abc import AsyncIterator

import pytest

from rockbot.kube import KubeClient
from rockbot.scripts_manager.backends import InputFile, SandboxFailure, ScriptJob, pod_jobs
from rockbot.scripts_manager.backends.outputs import OutputBounds, received
from rockbot.scripts_manager.backends.pods import PodBackend
from tests.kubeapi import KubeApiEmulator
from tests.scripts_manager import output_cases as cases
from tests.scripts_manager.conftest import MakeSettings, node, pod_backend
from tests.scripts_manager.output_cases import LINKED, PNG, job, named


@pytest.fixture
async def pods(kube_api: KubeApiEmulator, kube: KubeClient, make_settings: MakeSettings) -> AsyncIterator[PodBackend]:
    async with node(kube_api, kube), pod_backend(make_settings(scripts_backend="pods")) as backend:
        yield backend


async def test_a_scripts_output_comes_back_described_with_plt_show_figures(pods: PodBackend) -> None:
    result = await pods.run(job(f"""
        import base64, os, pathlib
        out = pathlib.Path(os.environ["ROCKBOT_OUTPUT_DIR"])
        (out / "clean.csv").write_text("month,revenue\\n2026-01,10\\n")
        (out / "charts").mkdir()
        (out / "charts" / "a.png").write_bytes(base64.b64decode({base64.b64encode(PNG).decode()!r}))
        print(out)
    """))
    assert result.exit_code == 0, result.stderr
    assert result.stdout == "/output\n"
    assert [(a.name, a.media_type, a.size) for a in result.artifacts] == [
        ("charts/a.png", "image/png", len(PNG)), ("clean.csv", "text/csv", 25),
    ]
    assert result.artifacts[1].preview == "month,revenue\n2026-01,10"
    assert result.artifacts_dropped == ()
    await cases.require_matplotlib(pods, python="the node's Python")
    figures = await pods.run(job("""
        import matplotlib.pyplot as plt
        plt.plot([1, 2, 3], [3, 1, 2])
        plt.figure(); plt.bar(["a", "b"], [1, 2])
        plt.show()
    """, memory="1Gi"))
    assert figures.exit_code == 0, figures.stderr
    assert [(a.name, a.media_type) for a in figures.artifacts] == [
        ("figure-1.png", "image/png"), ("figure-2.png", "image/png"),
    ]


async def test_the_conversations_files_are_under_input_read_only_and_come_back_changed(pods: PodBackend) -> None:
    sales = b"month,revenue\n" + b"".join(b"2026-%02d,%d\n" % (n % 12 + 1, n) for n in range(80_000))  # ~1.3 MB
    result = await pods.run(job("""
        import os, pathlib
        source = pathlib.Path(os.environ["ROCKBOT_INPUT_DIR"])
        rows = (source / "data" / "sales.csv").read_bytes().splitlines()
        pathlib.Path("/output/clean.csv").write_bytes(b"\\n".join(row.upper() for row in rows) + b"\\n")
        for attempt in ("/input/p.png", "/input/new.txt", "/input/data/new.txt"):
            try:
                open(attempt, "w").write("changed")
                print("wrote", attempt)
            except OSError as exc:
                print("refused", exc.errno)
        print(sorted(os.listdir(source)), (source / "p.png").stat().st_size)
    """, files=(InputFile(name="data/sales.csv", content=sales), InputFile(name="p.png", content=PNG))))
    assert result.exit_code == 0, result.stderr
    # /input itself is the kubelet's emptyDir (root's, 0777): a new name there is the script's own
    assert result.stdout == f"refused 13\nwrote /input/new.txt\nrefused 13\n['data', 'new.txt', 'p.png'] {len(PNG)}\n"
    assert named(result) == {"clean.csv": sales.upper()}


async def test_links_odd_names_and_fake_images_never_come_back_as_they_claim(pods: PodBackend) -> None:
    deep = 'os.makedirs("/output/../output/deep/../deep/er")\nopen("/output/deep/er/x.txt", "w").write("x")\n'
    tmp = 'os.symlink("/tmp", "/output/tmp")\n'
    result = await pods.run(job(cases.LINKS + tmp + cases.ODD_NAMES + cases.FAKE_IMAGES + deep))
    assert result.stdout == "cross-device 18\n", result.stderr
    assert {a.name: a.media_type for a in result.artifacts} == cases.FAKE_IMAGES_TYPED | {"deep/er/x.txt": "text/plain"}
    assert sorted(result.artifacts_dropped) == sorted([*cases.LINKS_DROPPED, *cases.ODD_NAMES_DROPPED,
                                                       f"tmp: a symbolic link {LINKED}"])  # fmt: skip


async def test_ten_thousand_tiny_files_and_one_too_big_are_bounded_and_said(pods: PodBackend) -> None:
    result = await pods.run(job('open("/output/a-big.bin", "wb").write(b"x" * 1001)\n' + cases.TINY_FILES,
                                bounds=OutputBounds(files=5, file_bytes=1000, total_bytes=1500)))  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert named(result) == {f"f{n:05}.txt": str(n).encode() for n in range(5)}
    assert result.artifacts_dropped[0] == "a-big.bin: 1,001 bytes, over the bound of 1,000 bytes per file"
    assert result.artifacts_dropped[1] == "f00005.txt: over the bound of 5 files"
    assert result.artifacts_dropped[-1] == "and 9,986 more files left out"


async def test_a_script_cannot_add_files_to_the_answer_after_it_ended(pods: PodBackend) -> None:
    """A daemon the script leaves keeps writing under /output while the runner reads it: what comes back is
    still within the bounds, and every file is one the walk read as a regular file."""
    result = await pods.run(job("""
        import os, time
        if os.fork() == 0:
            os.setsid()
            n = 0
            while True:
                n += 1
                try:
                    with open(f"/output/d{n % 50:02}.bin", "wb") as f:
                        f.write(b"d" * (n % 900))
                    os.replace(f"/output/d{n % 50:02}.bin", f"/output/e{n % 7}.bin")
                    os.symlink("/etc/passwd", f"/output/s{n % 50:02}")
                except OSError:
                    pass
        time.sleep(0.2)
    """, bounds=OutputBounds(files=10, file_bytes=1000, total_bytes=3000)))
    assert result.exit_code == 0, result.stderr
    assert len(result.artifacts) <= 10 and sum(a.size for a in result.artifacts) <= 3000
    assert all(set(a.content) <= {ord("d")} for a in result.artifacts)


@pytest.mark.parametrize(("files", "why"), [
    ([{"name": "../etc/passwd", "content": ""}], "relative path"),
    ([{"name": "/etc/passwd", "content": ""}], "relative path"),
    ([{"name": "a\x1bb", "content": ""}], "printable"),
    ([{"name": "big", "content": base64.b64encode(b"x" * 11).decode()}], "over the bounds"),
    ([{"name": f"f{n}", "content": ""} for n in range(3)], "over the bound of 2"),
    ([{"name": "a", "content": "not base64!"}], "not base64"),
    ("files", "not a list"),
])
def test_what_a_runner_sends_is_checked_again(files: object, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        received(files, [], bounds=OutputBounds(files=2, file_bytes=10, total_bytes=20))


async def test_a_runner_answer_over_the_bounds_is_a_broken_protocol(
    pods: PodBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The manager never takes more than the bounds it set, whatever the pod says (here: a runner given none)."""
    honest = pod_jobs.job_line

    def unbounded(*, job: ScriptJob, nonce: str, max_output_bytes: int) -> bytes:
        return honest(job=job.model_copy(update={"output_bounds": OutputBounds()}), nonce=nonce,
                      max_output_bytes=max_output_bytes)  # fmt: skip

    monkeypatch.setattr(pod_jobs, "job_line", unbounded)
    with pytest.raises(SandboxFailure, match="broke its runner's protocol: the runner sent 3 files"):
        await pods.run(job("""
            for n in range(3):
                open(f"/output/{n}", "w").write("x")
        """, bounds=OutputBounds(files=2)))


async def test_files_up_to_the_full_bounds_come_back_whole_from_a_pod(pods: PodBackend) -> None:
    """A call whose files the manager keeps in the console (its request names `output_files`) has the full bounds,
    not what one bus answer carries: a pod's runner sends two 10 MiB files whole, and names the one over 10 MiB."""
    mib = 1024 * 1024
    result = await pods.run(job("""
        import random
        for n, name in enumerate(("a.bin", "b.bin", "c.bin")):
            open("/output/" + name, "wb").write(random.Random(n).randbytes(10 * 1024 * 1024 + (n == 2)))
    """, bounds=OutputBounds(files=20, file_bytes=10 * mib, total_bytes=50 * mib)))
    assert result.exit_code == 0, result.stderr
    assert named(result) == {"a.bin": random.Random(0).randbytes(10 * mib),
                             "b.bin": random.Random(1).randbytes(10 * mib)}  # fmt: skip
    assert result.artifacts_dropped == (
        f"c.bin: {10 * mib + 1:,} bytes, over the bound of {10 * mib:,} bytes per file",)
