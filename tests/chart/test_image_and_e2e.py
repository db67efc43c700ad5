"""What can be checked of the image and of scripts/e2e-real without running them (e2e/ runs them)."""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib

import yaml

from tests.chart.conftest import CHART, REPO

E2E_SCRIPT = REPO / "scripts" / "e2e-real"


def test_e2e_script_parses_and_passes_shellcheck() -> None:
    subprocess.run(["bash", "-n", str(E2E_SCRIPT)], check=True)
    shellcheck = shutil.which("shellcheck")
    assert shellcheck, "shellcheck is not installed: apt-get install -y shellcheck"
    done = subprocess.run([shellcheck, str(E2E_SCRIPT)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout


def test_image_user_is_the_uid_the_chart_runs_as() -> None:
    dockerfile = (REPO / "Dockerfile").read_text()
    users = re.findall(r"^USER\s+(\d+):(\d+)\s*$", dockerfile, flags=re.MULTILINE)
    assert users, "the final stage must set a numeric USER uid:gid"
    uid, gid = map(int, users[-1])
    security = yaml.safe_load((CHART / "values.yaml").read_text())["podSecurityContext"]
    assert (uid, gid) == (security["runAsUser"], security["runAsGroup"])
    assert uid != 0
    assert re.search(r'^ENTRYPOINT \["rockbot"\]$', dockerfile, flags=re.MULTILINE)


def test_base_image_is_pinned_to_an_exact_python_release() -> None:
    dockerfile = (REPO / "Dockerfile").read_text()
    (base,) = re.findall(r"^ARG PYTHON_IMAGE=(\S+)$", dockerfile, flags=re.MULTILINE)
    assert re.fullmatch(r"python:3\.1[1-9]\.\d+-slim-\w+(@sha256:[0-9a-f]{64})?", base), base


def test_dockerignore_lets_in_every_package_folder() -> None:
    """A package folder missing from the allow-list would silently be left out of the image."""
    lines = (REPO / ".dockerignore").read_text().splitlines()
    allowed = {line[1:].strip("/") for line in lines if line.startswith("!")}
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    folders = set(project["tool"]["setuptools"]["package-dir"].values())
    assert folders <= allowed, f"add to .dockerignore: {sorted('!' + f + '/' for f in folders - allowed)}"
    assert {"pyproject.toml", "README.md"} <= allowed
    missing = sorted(entry for entry in allowed if not (REPO / entry).exists())
    assert missing == [], f"the allow-list names files that do not exist: {missing}"


def test_python_never_runs_with_the_checkout_on_sys_path() -> None:
    """The repository's operator/ folder would shadow the standard library's `operator` module."""
    script = E2E_SCRIPT.read_text()
    first_python = min(script.index(call) for call in ("/usr/bin/python3", ".venv/bin/pytest"))
    assert script.index("export PYTHONSAFEPATH=1") < first_python
    dockerfile = (REPO / "Dockerfile").read_text()
    build_stage = dockerfile.split("\nFROM ")[1]
    assert "PYTHONSAFEPATH=1" in build_stage and "WORKDIR /src" in build_stage
