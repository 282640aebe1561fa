"""The test suite is isolated from any Ray cluster on the machine: a test's Ray instance is its own, whatever
`ray start` cluster, address file or RAY_ADDRESS the machine has."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]

# In a fresh process, as an xdist worker starts: the suite's conftest, then the session's Ray instance (the
# ray_session fixture's start), once per address that Ray's own address file names (what `ray start` writes)
_SETUP = """
import json, os, sys
sys.path.insert(0, sys.argv[1])
import conftest
import ray
from ray._common.utils import get_ray_address_file
for address in sys.argv[2:]:
    path = get_ray_address_file(None)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    open(path, "w").write(address)
    conftest.start_test_ray()
    ctx = ray.get_runtime_context()
    print(json.dumps({"gcs": ctx.gcs_address, "resources": ray.cluster_resources()}), flush=True)
    ray.shutdown()
"""


def test_setup_ignores_a_running_cluster_and_a_stale_address_file(ray_cluster):
    """With a `ray start` cluster running, named both by RAY_ADDRESS and by Ray's address file, and then with
    only a stale address file (nothing listens there), the session's Ray instance is a new private one, with
    the resources the tests ask for."""
    from test_ray_join import _free_port  # tests/runtime's own helper (a module name unique in the suite)

    ray_tmp = tempfile.mkdtemp(prefix="tliso-", dir="/tmp")  # short: Ray's socket paths are limited
    try:
        env = {**ray_cluster.env, "RAY_TMPDIR": ray_tmp}  # RAY_TMPDIR: where Ray looks for its address file
        stale = f"127.0.0.1:{_free_port()}"
        out = subprocess.run([sys.executable, "-c", _SETUP, str(TESTS), ray_cluster.address, stale], env=env,
                             capture_output=True, text=True, timeout=180)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert out.returncode == 0, out.stderr[-2000:]
    started = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert len(started) == 2
    for one in started:
        assert one["gcs"] != ray_cluster.address
        assert one["resources"].get("CPU") == 2 and one["resources"].get("GPU") == 1
    assert os.environ["RAY_ADDRESS"] == "local"
