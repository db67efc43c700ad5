"""The README's resource reference is the one generated from the models."""

from __future__ import annotations

import pathlib

from rockbot.crdgen import reference_table

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def test_readme_reference_table_matches_the_models():
    text = README.read_text()
    between = text.split("<!-- reference:start -->\n", 1)[1].split("\n<!-- reference:end -->", 1)[0]
    assert between == reference_table(), "regenerate the README table from rockbot.crdgen.reference_table()"


def test_readme_documents_the_command_ci_runs():
    ci = (README.parent / ".ci" / "run").read_text()
    assert "exec scripts/test" in ci and "\nscripts/test\n" in README.read_text()
