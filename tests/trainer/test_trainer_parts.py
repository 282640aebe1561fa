"""The trainer split by duty: one weight publisher per synchronizer method behind one interface, a checkpointer,
loss entries that declare what they need, and the data-parallel trainer behind the same interface."""

import torch

from trinity_like.algorithms import LossNeeds, loss_needs
from trinity_like.algorithms.losses import POLICY_LOSSES
from trinity_like.config import load_config
from trinity_like.runtime.checkpoints import latest_checkpoint
from trinity_like.runtime.paths import RunPaths
from trinity_like.trainer.engine import TRAINERS, TrainEngineWrapper
from trinity_like.trainer.ppo import PPOTrainer
from trinity_like.trainer.workers import DataParallelTrainer
from trinity_like.weights.files import read_weights, version_of
from trinity_like.weights.publish import (
    PUBLISHERS,
    BroadcastPublisher,
    FilePublisher,
    ObjectStorePublisher,
    SharedMemoryPublisher,
    WeightPublisher,
)


def _trainer(tmp_path, model_path, *overrides):
    # compared with references computed on the CPU: pinned there (`auto` would take a GPU where there is one)
    cfg = load_config(None, [f"checkpoint_root_dir={tmp_path}", f"model.path={model_path}", "trainer.device=cpu", "name=parts",
                             "trainer.micro_batch_size=4", *overrides])
    t = PPOTrainer(cfg)
    t.prepare()
    return t


def test_one_publisher_per_method_behind_one_interface():
    assert PUBLISHERS.names() == ("broadcast", "checkpoint", "ipc", "memory")
    classes = {"checkpoint": FilePublisher, "memory": ObjectStorePublisher, "broadcast": BroadcastPublisher,
               "ipc": SharedMemoryPublisher}
    for name, cls in classes.items():
        assert PUBLISHERS.get(name) is cls and issubclass(cls, WeightPublisher)
    # only file versions are written by every rank (their bytes add up) and rolled back on resume
    assert [n for n in PUBLISHERS.names() if PUBLISHERS.get(n).writes_files] == ["checkpoint"]


def test_engines_implement_the_wrapper_and_the_type_comes_from_the_registry():
    assert TRAINERS.get("ppo") is PPOTrainer
    assert issubclass(PPOTrainer, TrainEngineWrapper) and issubclass(DataParallelTrainer, TrainEngineWrapper)


def test_file_publisher_writes_a_version_that_reads_back(tmp_path, tiny_model_path, batch_exps):
    t = _trainer(tmp_path, tiny_model_path)
    t.train_step(batch_exps)
    assert isinstance(t.publisher, FilePublisher)
    vdir = t.save_state_dict()  # standalone: no monitor, the single writer completes the version
    assert version_of(vdir) == 1
    weights, size = read_weights(vdir)
    assert size >= sum(v.numel() * v.element_size() for v in weights.values())  # files: tensors + headers
    expected = t.policy_state_dict()
    assert set(weights) == set(expected)
    assert all(torch.equal(weights[k], expected[k]) for k in expected)


def test_checkpointer_round_trip_restores_the_step_and_the_weights(tmp_path, tiny_model_path, batch_exps):
    t = _trainer(tmp_path, tiny_model_path)
    t.train_step(batch_exps)
    path = t.save_checkpoint()
    assert latest_checkpoint(RunPaths.of(t.cfg).checkpoint_dir) == path
    again = _trainer(tmp_path, tiny_model_path)
    again.load_checkpoint(path)
    assert again.train_step_num == 1
    before, after = t.policy_state_dict(), again.policy_state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_losses_declare_what_they_need():
    assert loss_needs("dpo") == LossNeeds(paired_rows=True, reference_as_old=True)
    assert loss_needs("dpo").rows_per_unit == 2
    for name in POLICY_LOSSES.names():
        if name != "dpo":
            assert loss_needs(name) == LossNeeds() and loss_needs(name).rows_per_unit == 1, name


def test_units_keep_pairs_whole(tmp_path, tiny_model_path):
    t = _trainer(tmp_path, tiny_model_path, "algorithm.policy_loss=dpo", "explorer.repeat_times=2")
    assert t.uses_reference and t.ref_model is not None
    # pairs 2, 0, 1 -> rows (4, 5), (0, 1), (2, 3)
    assert t._rows_of_units(torch.tensor([2, 0, 1])).tolist() == [4, 5, 0, 1, 2, 3]
    plain = _trainer(tmp_path, tiny_model_path)
    assert not plain.uses_reference and plain.ref_model is None
    assert plain._rows_of_units(torch.tensor([2, 0, 1])).tolist() == [2, 0, 1]
