"""`make test` installs what its tests need from the system where it can (tools/test-deps): redis-server and bwrap,
with apt-get as root, as .ci/run does; elsewhere one line says which tests will skip and how to install them; a
machine that has both is left alone. The script decides from what `command -v` finds on PATH, so each case runs it
on a PATH of its own: a folder holding the tools it reads (sed, id) and, as the case asks, a redis-server, a bwrap
and an apt-get (links to `true`: only their presence is read, and --dry-run prints the install instead of running
it)."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tools" / "test-deps"


def _run(tmp_path: Path, present: set[str], uid: int, *args: str) -> subprocess.CompletedProcess:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True)
    for tool in ("sed", "id"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    for tool in present:
        (bin_dir / tool).symlink_to(shutil.which("true"))
    env = {"PATH": str(bin_dir), "TEST_DEPS_UID": str(uid), "HOME": os.environ.get("HOME", "/")}
    return subprocess.run([shutil.which("bash"), str(SCRIPT), *args], env=env, capture_output=True, text=True,
                          timeout=30)


def test_a_machine_that_has_both_is_left_alone(tmp_path):
    out = _run(tmp_path, {"redis-server", "bwrap", "apt-get"}, 0, "--dry-run")
    assert (out.returncode, out.stdout, out.stderr) == (0, "", "")


@pytest.mark.parametrize(("present", "packages"), [
    (set(), "redis-server bubblewrap"), ({"redis-server"}, "bubblewrap"), ({"bwrap"}, "redis-server")])
def test_as_root_with_apt_get_what_is_missing_is_installed(tmp_path, present, packages):
    out = _run(tmp_path, present | {"apt-get"}, 0, "--dry-run")
    assert out.returncode == 0
    assert out.stdout == ("would run: apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "
                          f"{packages}\n")


@pytest.mark.parametrize(("present", "uid"), [({"apt-get"}, 1000), (set(), 0)], ids=["not-root", "no-apt-get"])
def test_elsewhere_one_line_says_which_tests_skip_and_how_to_install(tmp_path, present, uid):
    out = _run(tmp_path, present, uid)
    assert out.returncode == 0 and out.stderr == ""
    assert out.stdout.splitlines() == [
        "make test: the Redis transport's (no redis-server) and the python tool's sandbox (no bwrap) tests will "
        "skip: install with sudo apt-get install redis-server bubblewrap (or your system's packages of them)"]
    assert _run(tmp_path / "again", {"redis-server"} | present, uid).stdout.startswith(
        "make test: the python tool's sandbox (no bwrap) tests will skip: install with sudo apt-get install "
        "bubblewrap")


def test_ci_requires_them_and_make_test_asks_first(tmp_path):
    assert _run(tmp_path, {"apt-get"}, 1000, "--require").returncode == 1
    assert "tools/test-deps --require" in (ROOT / ".ci" / "run").read_text()
    recipe = subprocess.run(["make", "-n", "test"], cwd=ROOT, capture_output=True, text=True, timeout=60).stdout
    lines = recipe.splitlines()
    deps = next(i for i, line in enumerate(lines) if "tools/test-deps" in line)
    assert deps < next(i for i, line in enumerate(lines) if "-m pytest" in line)
