"""Two Ray nodes on this machine: the trainer on the head, the explorer pinned to a second node that has its own
run directory root (no shared filesystem between the roles), experiences over Redis, weights over the gloo
collective. What a second host would add (another address, another disk) is stood in for by a second `ray
start` with its own temp dir and resources and a run directory root the trainer never reads.
"""

from __future__ import annotations

import json

import pytest
from conftest import (  # tests/ is on sys.path (rootdir conftest, no package)
    RayCluster,
    machine_ip,
)
from test_jobs import _driver, _records, _status, _wait_until, _write_cfg, check_ledger

from trinity_like.common.metrics import read_metrics
from trinity_like.config import load_config
from trinity_like.runtime.paths import RunPaths

pytestmark = pytest.mark.slow


@pytest.fixture
def two_nodes(tmp_path):
    ip = machine_ip()
    if ip == "127.0.0.1":
        pytest.skip("this machine has no address besides loopback, which a second Ray node cannot join")
    cluster = RayCluster(node_ip=ip, head_resources={"trainer_node": 4})
    cluster.start()
    try:
        cluster.explorer_node = cluster.add_node(resources={"rollout_node": 4}, labels={"pool": "rollout"})
        yield cluster
    finally:
        cluster.stop()


def test_explorer_on_a_second_node_without_the_run_directory(tmp_path, tiny_model_path, two_nodes, redis_server_at):
    redis = redis_server_at(two_nodes.node_ip)
    common = {"buffer__transport": "redis", "buffer__redis_url": redis.url, "synchronizer__method": "broadcast",
              "trainer__total_steps": 4, "trainer__node": {"resources": {"trainer_node": 0.01}}}
    head, second, blind_node = (tmp_path / d for d in ("head", "second-node", "blind-node"))
    for d in (head, second, blind_node):
        d.mkdir()
    # one config per node, each with its own run directory root (the explorer node's is never the trainer's)
    trainer_cfg = _write_cfg(head, tiny_model_path, "far", **common, checkpoint_root_dir=str(head / "runs"))
    explorer_cfg = _write_cfg(second, tiny_model_path, "far", **common, checkpoint_root_dir=str(second / "runs"),
                              explorer__node={"resources": {"rollout_node": 0.01}, "labels": {"pool": "rollout"}})
    trainer = _driver(two_nodes, trainer_cfg, "trainer")
    _wait_until(lambda: "trainer trainer-" in trainer.output, 240, "the trainer to join", [trainer])

    # a role that needs the run directory (the file buffer) and does not see it is stopped in one line
    blind = _write_cfg(blind_node, tiny_model_path, "far", checkpoint_root_dir=str(blind_node / "runs"),
                       trainer__total_steps=4, explorer__node={"resources": {"rollout_node": 0.01}})
    refused = _driver(two_nodes, blind, "explorer")
    assert refused.wait(240) != 0
    assert "does not see the run directory" in refused.output and "mount" in refused.output, refused.output

    explorer = _driver(two_nodes, explorer_cfg, "explorer")
    _wait_until(lambda: "explorer explorer-" in explorer.output, 240, "the explorer to join", [explorer])
    nodes = {r["kind"]: r["node_id"] for r in _status(two_nodes, trainer_cfg)["roles"]}
    assert nodes["explorer"] == two_nodes.explorer_node != nodes["trainer"]  # pinned by resources and label

    assert trainer.wait(600) == 0, trainer.output
    assert explorer.wait(120) == 0, explorer.output
    check_ledger(trainer_cfg)  # each experience trained exactly once, nothing lost
    here = RunPaths.of(load_config(explorer_cfg)).run_dir
    assert not (here / "run_id").exists() and not (here / "buffer").exists() and not (here / "tasks.parquet").exists()
    local, _ = read_metrics(here / "metrics.jsonl")  # the explorer's own copy on its node ...
    relayed = _records(trainer_cfg, "explorer")  # ... and the same records in the trainer's run directory
    assert local and [r["step"] for r in relayed] == [r["step"] for r in local]
    summary = json.loads(explorer.output.rsplit("summary: ", 1)[1].splitlines()[0])
    assert summary["explorer_steps"] == len([r for r in local if "rollout/reward_mean" in r]) > 0, summary
    assert {r["trainer/version"] for r in _records(trainer_cfg, "trainer")} == {1, 2, 3, 4}
    assert max(r["sync/version"] for r in relayed) >= 1  # weights reached the second node by the collective

