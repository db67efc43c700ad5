"""The README and the pages it sends readers to tell the truth: the resource reference, the CI command, the built-in
tool sets; and the README stays a front door (the details live in the docs site)."""

from __future__ import annotations

import pathlib

from rockbot.contracts.builtin_tools import BUILTIN_TOOLS
from rockbot.crdgen import reference_table

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"
RESOURCES = README.parent / "docs" / "concepts" / "resources.md"
TOOLS = README.parent / "docs" / "concepts" / "tools.md"


def test_resources_page_reference_table_matches_the_models():
    text = RESOURCES.read_text()
    between = text.split("<!-- reference:start -->\n", 1)[1].split("\n<!-- reference:end -->", 1)[0]
    assert between == reference_table(), "regenerate the resources page's table: rockbot.crdgen.reference_table()"


def test_readme_documents_the_command_ci_runs():
    ci = (README.parent / ".ci" / "run").read_text()
    assert "exec scripts/test" in ci and "\nscripts/test\n" in README.read_text()


def test_tools_page_lists_every_built_in_tool_under_its_set():
    rows = {
        line.split("|")[1].strip().strip("`"): line.split("|")[2]
        for line in TOOLS.read_text().splitlines()
        if line.startswith("| `") and line.count("|") == 4  # | Set | Tools | The design's names |
    }
    missing = [
        f"{tool.tool_set}: {tool.name}" for tool in BUILTIN_TOOLS if f"`{tool.name}`" not in rows.get(tool.tool_set, "")
    ]
    assert missing == [], "docs/concepts/tools.md: add these tools to their set's row of the built-in tools table"


def test_readme_is_a_front_door():
    """What rockbot is, the picture, the two commands and links into the site: under 200 lines."""
    lines = README.read_text().splitlines()
    assert len(lines) < 200, f"README.md has {len(lines)} lines: move the details into docs/"
