"""The README tells the truth: the resource reference, the CI command, the built-in tool sets."""

from __future__ import annotations

import pathlib

from rockbot.contracts.builtin_tools import BUILTIN_TOOLS
from rockbot.crdgen import reference_table

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def test_readme_reference_table_matches_the_models():
    text = README.read_text()
    between = text.split("<!-- reference:start -->\n", 1)[1].split("\n<!-- reference:end -->", 1)[0]
    assert between == reference_table(), "regenerate the README table from rockbot.crdgen.reference_table()"


def test_readme_documents_the_command_ci_runs():
    ci = (README.parent / ".ci" / "run").read_text()
    assert "exec scripts/test" in ci and "\nscripts/test\n" in README.read_text()


def test_readme_lists_every_built_in_tool_under_its_set():
    rows = {
        line.split("|")[1].strip().strip("`"): line.split("|")[2]
        for line in README.read_text().splitlines()
        if line.startswith("| `") and line.count("|") == 4  # | Set | Tools | The design's names |
    }
    missing = [
        f"{tool.tool_set}: {tool.name}" for tool in BUILTIN_TOOLS if f"`{tool.name}`" not in rows.get(tool.tool_set, "")
    ]
    assert missing == [], "README: add these tools to their set's row of the built-in tools table"
