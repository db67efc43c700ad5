"""The distribution imports as one `rockbot` namespace from outside the repository."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import tomllib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
PROCESS_FOLDERS = {
    "rockbot": "rockbot",
    "operator": "rockbot.operator",
    "agent": "rockbot.agent",
    "scripts_manager": "rockbot.scripts_manager",
}
IMPORT_ALL = "import rockbot, rockbot.operator, rockbot.agent, rockbot.scripts_manager, rockbot.cli, operator"


def _packages_on_disk() -> set[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    found = set()
    for package, folder in config.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            relative = init.parent.relative_to(ROOT / folder)
            found.add(".".join([package, *relative.parts]))
    return found


def _where(python_path: str | None, module: str, cwd: pathlib.Path) -> str:
    env = {"PYTHONPATH": python_path} if python_path else {}
    code = f"{IMPORT_ALL}; import operator as std; assert hasattr(std, 'itemgetter'); print({module}.__file__)"
    result = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, check=True)
    return result.stdout.strip()


def test_every_package_folder_is_listed_in_pyproject():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    assert _packages_on_disk() - listed == set(), "add the missing packages to [tool.setuptools] packages"


def test_installed_project_imports_from_outside_the_repository(tmp_path):
    where = pathlib.Path(_where(None, "rockbot.operator", tmp_path))
    assert where.is_relative_to(ROOT) or "site-packages" in where.parts  # editable here, installed in a wheel venv


@pytest.mark.slow
def test_built_wheel_imports_all_of_it_from_outside_the_repository(tmp_path):
    wheels = tmp_path / "wheels"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(wheels), str(ROOT)],
        check=True,
        capture_output=True,
        text=True,
    )
    assert "Warning" not in build.stderr, build.stderr  # scripts/setup shows a new user whatever the build prints
    (wheel,) = wheels.glob("rockbot-*.whl")
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
        check=True,
        capture_output=True,
    )
    for module in ("rockbot", "rockbot.operator", "rockbot.agent", "rockbot.scripts_manager"):
        assert pathlib.Path(_where(str(site), module, tmp_path)).is_relative_to(site)
    installed = {".".join(init.parent.relative_to(site).parts) for init in site.glob("rockbot/**/__init__.py")}
    assert installed == _packages_on_disk()
    assert (site / "rockbot/console/web/templates/login.html").is_file()  # data files travel with the code
    assert (site / "rockbot/console/web/static/console.css").is_file()


@pytest.mark.parametrize("python", sorted({sys.executable, "/usr/bin/python3"}))
def test_python_run_from_the_root_gets_the_standard_librarys_operator(python):
    """`python3 -m venv .venv` there puts the root first on sys.path, where the `operator/` folder stands."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONSAFEPATH"}
    done = subprocess.run([python, "-c", "import collections, operator; print(operator.eq(1, 1), operator.__all__[0])"],
                          cwd=ROOT, env=env, capture_output=True, text=True, check=False, timeout=60)
    assert (done.returncode, done.stdout, done.stderr) == (0, "True abs\n", "")
