"""The `rockbot` command as a user runs it: a real subprocess."""

from __future__ import annotations

import subprocess
import sys

import yaml


def rockbot(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rockbot.cli", *args], capture_output=True, text=True, timeout=60)


def test_help_lists_every_process():
    result = rockbot("--help")
    assert result.returncode == 0
    for command in ("operator", "agent", "scripts-manager", "local", "openrouter-mcp", "crds"):
        assert command in result.stdout


def test_each_subcommand_has_useful_help():
    for command in ("operator", "agent", "scripts-manager", "local", "openrouter-mcp", "crds"):
        result = rockbot(command, "--help")
        assert result.returncode == 0, result.stderr
        assert "usage: rockbot " + command in result.stdout


def test_a_bad_flag_is_one_line_not_a_traceback():
    result = rockbot("crds", "--no-such-flag")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    assert "unrecognized arguments: --no-such-flag" in result.stderr and "Traceback" not in result.stderr


def test_crds_prints_one_yaml_stream_of_three_definitions():
    result = rockbot("crds")
    kinds = [doc["spec"]["names"]["kind"] for doc in yaml.safe_load_all(result.stdout)]
    assert kinds == ["Agent", "Tool", "ScheduledTask"]


def test_crds_write_regenerates_the_files(tmp_path):
    result = rockbot("crds", "--write", str(tmp_path))
    assert result.returncode == 0
    assert sorted(path.name for path in tmp_path.iterdir()) == [
        "agents.rockbot.dev.yaml",
        "scheduledtasks.rockbot.dev.yaml",
        "tools.rockbot.dev.yaml",
    ]
