"""Files in and out of the local sandbox, as a script sees them and as a hostile script abuses them (issue 35)."""

from __future__ import annotations

import asyncio
import os
import tempfile
from pathlib import Path

import pytest

from rockbot.scripts_manager.backends import InputFile
from rockbot.scripts_manager.backends.local import LocalBackend
from rockbot.scripts_manager.backends.outputs import OutputBounds
from tests.scripts_manager import output_cases as cases
from tests.scripts_manager.conftest import MakeSettings
from tests.scripts_manager.output_cases import LINKED, PNG, job, named


@pytest.fixture(params=["bwrap", "unshare"])
async def sandbox(request: pytest.FixtureRequest, make_settings: MakeSettings) -> LocalBackend:
    return await LocalBackend.create(settings=make_settings(scripts_local_isolation=request.param))


@pytest.fixture
async def bwrap(make_settings: MakeSettings) -> LocalBackend:
    return await LocalBackend.create(settings=make_settings(scripts_local_isolation="bwrap"))


async def test_a_script_reads_the_conversations_files_and_its_output_comes_back_described(
    sandbox: LocalBackend,
) -> None:
    sales = b"month,revenue\n2026-01,10\n2026-02,12\n2026-03,9\n2026-04,15\n2026-05,11\n2026-06,13\n"
    result = await sandbox.run(job("""
        import os, pathlib
        source = pathlib.Path(os.environ["ROCKBOT_INPUT_DIR"])
        out = pathlib.Path(os.environ["ROCKBOT_OUTPUT_DIR"])
        rows = (source / "data" / "sales.csv").read_text().splitlines()
        (out / "clean.csv").write_text("\\n".join(row.upper() for row in rows) + "\\n")
        (out / "charts").mkdir()
        (out / "charts" / "a.png").write_bytes((source / "p.png").read_bytes())
        print(sorted(os.listdir(source)))
    """, files=(InputFile(name="data/sales.csv", content=sales), InputFile(name="p.png", content=PNG))))
    assert result.exit_code == 0, result.stderr
    assert result.stdout == "['data', 'p.png']\n"
    assert [(a.name, a.media_type, a.size) for a in result.artifacts] == [
        ("charts/a.png", "image/png", len(PNG)), ("clean.csv", "text/csv", len(sales)),
    ]
    csv = result.artifacts[1]
    assert csv.content == sales.upper()
    assert csv.preview == "MONTH,REVENUE\n2026-01,10\n2026-02,12\n2026-03,9\n2026-04,15"
    assert result.artifacts[0].preview == ""
    assert result.artifacts_dropped == ()


async def test_the_input_folder_is_read_only(bwrap: LocalBackend) -> None:
    result = await bwrap.run(job("""
        for attempt in ("/input/a.txt", "/input/new.txt"):
            try:
                open(attempt, "w").write("changed")
                print("wrote", attempt)
            except OSError as exc:
                print("refused", exc.errno)
        print(open("/input/a.txt").read())
    """, files=(InputFile(name="a.txt", content=b"original"),)))
    assert result.stdout == "refused 30\nrefused 30\noriginal\n", result.stderr


async def test_symlinks_and_hard_links_out_of_the_output_folder_never_come_back(bwrap: LocalBackend) -> None:
    result = await bwrap.run(job(cases.LINKS + 'os.symlink("/input", "/output/inputs")\n',
                                 files=(InputFile(name="a.txt", content=b"in"),)))  # fmt: skip
    assert result.stdout == "cross-device 18\n", result.stderr
    assert result.artifacts == ()
    assert sorted(result.artifacts_dropped) == sorted([*cases.LINKS_DROPPED, f"inputs: a symbolic link {LINKED}"])


async def test_ten_thousand_tiny_files_give_the_bound_and_say_how_many_were_left_out(bwrap: LocalBackend) -> None:
    result = await bwrap.run(job(cases.TINY_FILES))
    assert result.exit_code == 0, result.stderr
    assert [a.name for a in result.artifacts] == [f"f{n:05}.txt" for n in range(20)]
    assert result.artifacts_dropped[0] == "f00020.txt: over the bound of 20 files"
    assert result.artifacts_dropped[-1] == "and 9,970 more files left out"
    assert len(result.artifacts_dropped) == 11


async def test_a_file_over_the_bound_is_dropped_by_name_and_the_others_kept(bwrap: LocalBackend) -> None:
    bounds = OutputBounds(files=5, file_bytes=1000, total_bytes=1500)
    result = await bwrap.run(job("""
        open("/output/a-big.bin", "wb").write(b"x" * 1001)
        open("/output/b.txt", "wb").write(b"y" * 1000)
        open("/output/c.txt", "wb").write(b"z" * 600)
        open("/output/d.txt", "wb").write(b"w" * 500)
    """, bounds=bounds))
    assert named(result) == {"b.txt": b"y" * 1000, "d.txt": b"w" * 500}
    assert result.artifacts_dropped == (
        "a-big.bin: 1,001 bytes, over the bound of 1,000 bytes per file",
        "c.txt: 600 bytes would pass the bound of 1,500 bytes per call",
    )


async def test_only_real_raster_images_are_typed_as_images(bwrap: LocalBackend) -> None:
    result = await bwrap.run(job(cases.FAKE_IMAGES + """
open("/output/page.html", "w").write("<script>alert(1)</script>")
open("/output/real.bin", "wb").write(bytes.fromhex("89504e470d0a1a0a") + b"rest")
"""))
    assert {a.name: a.media_type for a in result.artifacts} == cases.FAKE_IMAGES_TYPED | {
        "page.html": "text/html", "real.bin": "image/png",
    }


async def test_names_with_control_characters_are_dropped_and_never_printed_raw(bwrap: LocalBackend) -> None:
    result = await bwrap.run(job('open("/output/ok.txt", "w").write("fine")\n' + cases.ODD_NAMES))
    assert list(named(result)) == ["ok.txt"]
    assert sorted(result.artifacts_dropped) == cases.ODD_NAMES_DROPPED


async def test_a_folder_the_script_made_unwritable_is_still_cleaned_up(
    sandbox: LocalBackend, shared_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(shared_tmp))
    result = await sandbox.run(job("""
        import os
        out = os.environ["ROCKBOT_OUTPUT_DIR"]
        os.makedirs(f"{out}/locked/inner")
        open(f"{out}/locked/inner/x.txt", "w").write("x")
        os.chmod(f"{out}/locked/inner", 0)
        os.chmod(f"{out}/locked", 0o500)
    """))
    assert result.exit_code == 0, result.stderr
    assert await asyncio.to_thread(os.listdir, shared_tmp) == []


async def test_plt_show_saves_each_open_figure_as_a_png_under_output(bwrap: LocalBackend) -> None:
    await cases.require_matplotlib(bwrap, python="the sandbox's Python")
    result = await bwrap.run(job("""
        import matplotlib.pyplot as plt
        plt.plot([1, 2, 3], [3, 1, 2])
        plt.show()
        plt.figure(); plt.bar(["a", "b"], [1, 2])
        plt.figure(); plt.plot([1])
        plt.show()
        print(plt.get_fignums())
    """, memory="1Gi"))
    assert result.exit_code == 0, result.stderr
    assert result.stdout == "[]\n"  # show() closed them
    assert [(a.name, a.media_type) for a in result.artifacts] == [
        ("figure-1.png", "image/png"), ("figure-2.png", "image/png"), ("figure-3.png", "image/png"),
    ]
