"""The package installs beside the user's torch and leaves it (issue 35, item 1).

A GPU user's environment already holds a CUDA torch (the H100 image: 2.11.0+cu130, the torch vLLM 0.26 pins).
No CUDA torch exists on this machine, so the test stands one in: a ``torch-<version>.dist-info`` with nothing
but metadata, named as the fake it is, in a fresh virtual environment whose other packages are the project
venv's (a ``.pth`` line). pip is then asked, offline, what installing the project there would do."""

import json
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def _venv_with_torch(tmp_path: Path, version: str) -> Path:
    """A venv (no pip of its own) holding a stand-in torch ``version`` and, behind it, the project venv's
    packages; returns its python."""
    venv = tmp_path / f"venv-{version}"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    info = site / f"torch-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n")
    (info / "INSTALLER").write_text("stand-in\n")
    (info / "RECORD").write_text("")
    # after the stand-in on sys.path: everything else the project needs, so pip resolves without an index
    (site / "project-venv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


def _dry_run(python: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    report = tmp_path / "report.json"
    return subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--dry-run", "--no-index",
         "--no-build-isolation", "--report", str(report), "--disable-pip-version-check", str(ROOT)],
        capture_output=True, text=True, timeout=300)


def test_installing_beside_a_cuda_torch_leaves_it(tmp_path):
    python = _venv_with_torch(tmp_path, "2.11.0+cu130")
    proc = _dry_run(python, tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert _installs(tmp_path) == {"trinity-like"}  # the project, and no torch
    # and the next image's: a lower bound only, since an exact pin or a ceiling excludes some user's CUDA torch
    torch = _declared_torch(tmp_path)
    assert torch.specifier and {spec.operator for spec in torch.specifier} <= {">=", ">"}, str(torch)


def _report(tmp_path: Path) -> list[dict]:
    """What pip's report says it would install, one entry (with its metadata) a package."""
    return json.loads((tmp_path / "report.json").read_text())["install"]


def _installs(tmp_path: Path) -> set[str]:
    """The names of what pip's report says it would install."""
    return {canonicalize_name(item["metadata"]["name"]) for item in _report(tmp_path)}


def _declared_torch(tmp_path: Path) -> Requirement:
    """The torch requirement of the project's metadata, as pip built it from pyproject.toml."""
    (project,) = [item for item in _report(tmp_path) if canonicalize_name(item["metadata"]["name"]) == "trinity-like"]
    requirements = [Requirement(line) for line in project["metadata"]["requires_dist"]]
    (torch,) = [req for req in requirements if req.name == "torch"]
    return torch


def test_a_torch_too_old_for_the_project_would_be_replaced(tmp_path):
    """The control: the same check fails where the declared range excludes the installed torch (here below it;
    the exact pin this replaced excluded every CUDA build)."""
    python = _venv_with_torch(tmp_path, "2.0.0")
    proc = _dry_run(python, tmp_path)
    if proc.returncode == 0:  # pip found a torch in the configured find-links (/opt/wheels here): it would swap it
        assert "torch" in _installs(tmp_path), proc.stdout[-2000:]
    else:  # none to be found: pip stops, naming torch
        assert "torch" in proc.stderr and "No matching distribution" in proc.stderr, proc.stderr[-2000:]
