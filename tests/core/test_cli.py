"""The `rockbot` command as a user runs it: a real subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from rockbot.operator.settings import OperatorSettings


def rockbot(*args: str) -> subprocess.CompletedProcess[str]:
    """`rockbot ARGS` at a fixed width: argparse wraps help to $COLUMNS, and may break a word at its hyphen."""
    return subprocess.run([sys.executable, "-m", "rockbot.cli", *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "COLUMNS": "100"})


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


def test_crds_prints_one_yaml_stream_of_every_definition():
    result = rockbot("crds")
    kinds = [doc["spec"]["names"]["kind"] for doc in yaml.safe_load_all(result.stdout)]
    assert kinds == ["Agent", "Tool", "ScheduledTask", "Trigger", "Evaluation"]


def test_crds_write_regenerates_the_files(tmp_path):
    result = rockbot("crds", "--write", str(tmp_path))
    assert result.returncode == 0
    assert sorted(path.name for path in tmp_path.iterdir()) == [
        "agents.rockbot.dev.yaml",
        "evaluations.rockbot.dev.yaml",
        "scheduledtasks.rockbot.dev.yaml",
        "tools.rockbot.dev.yaml",
        "triggers.rockbot.dev.yaml",
    ]


def installed_rockbot(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The console script pip installed, with only the given environment (plus PATH and HOME)."""
    script = str(Path(sys.executable).parent / "rockbot")
    base = {"PATH": os.environ.get("PATH", ""), "HOME": env.pop("HOME", os.environ.get("HOME", "/root"))}
    return subprocess.run([script, *args], capture_output=True, text=True, timeout=60, env={**base, **env})


def test_every_operator_setting_has_a_flag_with_its_description():
    help_text = " ".join(rockbot("operator", "--help").stdout.split())
    for name, field in OperatorSettings.model_fields.items():
        assert field.description, f"OperatorSettings.{name} needs a description: it is the flag's help"
        assert f"--{name.replace('_', '-')}" in help_text
        assert f"{field.description} ($ROCKBOT_{name.upper()}" in help_text


def test_a_bad_operator_variable_is_one_line_naming_it(tmp_path):
    result = installed_rockbot("operator", env={"ROCKBOT_AGENT_PORT": "eighty", "KUBECONFIG": str(tmp_path / "kc")})
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert "ROCKBOT_AGENT_PORT='eighty': Input should be a valid integer" in result.stderr


def test_a_flag_overrides_its_variable_and_a_missing_kubeconfig_is_one_line(tmp_path):
    missing = tmp_path / "kubeconfig"
    result = installed_rockbot(
        "operator", "--agent-port", "9000", "--log-format", "text",
        env={"ROCKBOT_AGENT_PORT": "eighty", "KUBECONFIG": str(missing), "HOME": str(tmp_path)},
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert f"no kubeconfig file at {missing}: set KUBECONFIG" in result.stderr  # the bad variable was overridden


def test_a_bad_operator_flag_value_is_one_line_naming_the_flag():
    result = installed_rockbot("operator", "--resync-seconds", "soon", env={})
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    assert "--resync-seconds 'soon': Input should be a valid number" in result.stderr
