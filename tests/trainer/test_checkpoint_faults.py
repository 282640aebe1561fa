"""Faults around full checkpoints and trainer memory, on the tiny model:

* a damaged checkpoint (a flipped byte, a truncated file) fails its ``checksums.json``: a resume skips it, with a
  WARNING naming it and the file, for the newest intact one before it; none intact is one RunError line;
  checkpoints written before checksums existed load unchecked;
* a trainer step that runs out of memory ends the run in one line naming the setting to lower, its rows pending
  (not committed) in the ledger, so a resume trains them again;
* a checkpoint write on a full disk (a real 32 MiB tmpfs) raises DiskFullError and leaves the previous checkpoint
  intact and ``latest`` naming it.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from trinity_like.common.errors import DiskFullError, RunError
from trinity_like.runtime.checkpoints import (
    CHECKSUMS,
    TRAINER_STATE,
    DamagedCheckpointError,
    read_pointer,
    resume_checkpoint,
)


def _two_checkpoints(make_trainer, batch_exps):
    """A trainer that saved step_1 and step_2; the weights step 1 saved."""
    t = make_trainer()
    t.train_step(batch_exps)
    t.save_checkpoint()
    at_1 = {k: v.clone() for k, v in t.policy_weights().items()}
    t.train_step(batch_exps)
    t.save_checkpoint()
    return t, at_1


def _flip_byte(path, offset=None):
    data = bytearray(path.read_bytes())
    i = len(data) // 2 if offset is None else offset
    data[i] ^= 0x01
    path.write_bytes(bytes(data))


def test_every_file_but_the_state_is_in_the_checksums(make_trainer, batch_exps):
    t, _ = _two_checkpoints(make_trainer, batch_exps)
    ckpt = t.latest_checkpoint()
    listed = json.loads((ckpt / CHECKSUMS).read_text())["files"]
    on_disk = {p.relative_to(ckpt).as_posix() for p in ckpt.rglob("*") if p.is_file()}
    assert set(listed) == on_disk - {CHECKSUMS, TRAINER_STATE}
    assert {"model/model.safetensors", "optimizer.pt", "scheduler.pt", "rng.pt"} <= set(listed)
    assert resume_checkpoint(t.paths.checkpoint_dir) == (ckpt, [])


@pytest.mark.parametrize("damage, problem", [
    (lambda c: _flip_byte(c / "model" / "model.safetensors"), "model/model.safetensors fails its checksum"),
    (lambda c: os.truncate(c / "optimizer.pt", (c / "optimizer.pt").stat().st_size - 100), "optimizer.pt has "),
], ids=["flipped-weights-byte", "truncated-optimizer"])
def test_a_damaged_checkpoint_is_skipped_for_the_previous_one(make_trainer, batch_exps, caplog, damage, problem):
    t, at_1 = _two_checkpoints(make_trainer, batch_exps)
    root = t.paths.checkpoint_dir
    damage(root / "step_2")
    with caplog.at_level(logging.WARNING, logger="trinity_like.runtime.checkpoints"):
        path, damaged = resume_checkpoint(root)
    assert path == root / "step_1"
    assert [(p.name, why[:len(problem)]) for p, why in damaged] == [("step_2", problem)]
    warning = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warning) == 1 and str(root / "step_2") in warning[0] and problem in warning[0]
    # the fallback loads, exactly as step 1 saved it
    resumed = make_trainer(name="run")
    resumed.load_checkpoint(path)
    assert resumed.train_step_num == 1
    for k, v in resumed.policy_weights().items():
        torch.testing.assert_close(v, at_1[k], rtol=0, atol=0)


def test_no_intact_checkpoint_left_is_one_line_naming_them(make_trainer, batch_exps):
    t, _ = _two_checkpoints(make_trainer, batch_exps)
    root = t.paths.checkpoint_dir
    _flip_byte(root / "step_2" / "model" / "model.safetensors")
    (root / "step_1" / "rng.pt").unlink()
    with pytest.raises(DamagedCheckpointError) as err:
        resume_checkpoint(root)
    msg = str(err.value)
    assert isinstance(err.value, RunError) and "\n" not in msg
    for needle in ("step_2: model/model.safetensors fails its checksum", "step_1: rng.pt is missing",
                   "without --resume", "restore the damaged files"):
        assert needle in msg, msg


def test_a_checkpoint_without_checksums_loads_as_before(make_trainer, batch_exps):
    """Checkpoints written before checksums existed: nothing to check, they load."""
    t, _ = _two_checkpoints(make_trainer, batch_exps)
    ckpt = t.latest_checkpoint()
    (ckpt / CHECKSUMS).unlink()
    assert resume_checkpoint(t.paths.checkpoint_dir) == (ckpt, [])
    resumed = make_trainer(name="run")
    resumed.load_checkpoint(ckpt)
    assert resumed.train_step_num == 2


def test_set_aside_moves_a_damaged_checkpoint_out_of_the_steps(make_trainer, batch_exps):
    from trinity_like.runtime.checkpoints import complete_steps, set_aside

    t, _ = _two_checkpoints(make_trainer, batch_exps)
    root = t.paths.checkpoint_dir
    dest = set_aside(root / "step_2")
    assert dest == root / "damaged" / "step_2" and (dest / TRAINER_STATE).is_file()
    assert complete_steps(root) == [1]
    t.save_checkpoint()  # pruning is not confused by the damaged folder
    assert complete_steps(root) == [2, 1]


# ---------------------------------------------------------------- out of memory


def _role(cfg, engine):
    from trinity_like.trainer.role import TrainerRole

    role = TrainerRole(cfg)
    role.engine = engine
    return role


def test_a_step_that_runs_out_of_cpu_memory_names_the_setting_to_lower(tmp_path, tiny_model_path):
    """A real allocation failure: the step runs in a child process whose address space (RLIMIT_AS) leaves it 64 MiB
    more than it holds after one small step, and the next micro-batch (64 rows x 400 tokens) needs more."""
    script = textwrap.dedent(f"""
        import resource
        from trinity_like.common.errors import RunError
        from trinity_like.common.experience import Experience
        from trinity_like.config import load_config
        from trinity_like.trainer.ppo import PPOTrainer
        from trinity_like.trainer.role import TrainerRole

        exps = [Experience(prompt_ids=[5, 6, 7], response_ids=[(i * 7 + j) % 50 + 3 for j in range(400)],
                           logprobs=[-1.0] * 400, group_id=f"g{{i // 3}}", reward=float(i % 3 == 0), model_version=0)
                for i in range(24)]
        cfg = load_config(None, ["checkpoint_root_dir={tmp_path}", "model.path={tiny_model_path}", "trainer.device=cpu",
                                 "explorer.repeat_times=3", "trainer.micro_batch_size=64", "trainer.num_threads=1"])
        engine = PPOTrainer(cfg)
        engine.prepare()
        engine.train_step(exps[:3])  # everything made once (thread pools, caches) before the limit
        role = TrainerRole(cfg)
        role.engine = engine
        vm = int(next(line for line in open("/proc/self/status") if line.startswith("VmSize")).split()[1]) * 1024
        resource.setrlimit(resource.RLIMIT_AS, (vm + (64 << 20), resource.RLIM_INFINITY))
        try:
            role._train(exps)
        except RunError as e:
            print("CAUGHT", type(e.__cause__).__name__, str(e))
        else:
            print("NO-OOM")
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    line = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else out.stderr[-2000:]
    assert line.startswith("CAUGHT "), line
    assert line.split()[1] in ("RuntimeError", "OutOfMemoryError", "MemoryError"), line
    for needle in ("trainer step 2 ran out of memory", "lower trainer.micro_batch_size (now 64)",
                   "trainer.max_token_len_per_micro_batch", "--resume"):
        assert needle in line, line


def test_a_gpu_out_of_memory_leaves_the_step_s_rows_pending(make_trainer, batch_exps, monkeypatch):
    """A fake of the GPU: CUDA cannot run out here, so the engine's step raises the ``torch.OutOfMemoryError``
    torch raises there. The role reads a real batch from a real buffer: the failed step commits nothing, and a
    resume (the ledger resumed at the last checkpoint) hands the same rows out again."""
    from trinity_like.buffer import BufferConsumer, BufferWriter
    from trinity_like.buffer.ledger import Ledger

    engine = make_trainer("trainer.max_token_len_per_micro_batch=4096", "trainer.gradient_checkpointing=true")
    cfg = engine.cfg
    BufferWriter(engine.paths.buffer_dir, writer_id="explorer").write(batch_exps)
    role = _role(cfg, engine)
    role.replay = None
    role.consumer = BufferConsumer(engine.paths.buffer_dir, "trainer", resume_step=0)
    monkeypatch.setattr(role, "_no_more_data", lambda: False)

    def oom(_exps):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity "
                                     "of 79.10 GiB of which 1.06 GiB is free.\nIf reserved but unallocated ...")
    monkeypatch.setattr(engine, "train_step", oom)
    with pytest.raises(RunError) as err:
        role.step()
    msg = str(err.value)
    assert "\n" not in msg and isinstance(err.value.__cause__, torch.OutOfMemoryError)
    assert msg.startswith("trainer step 1 ran out of memory (CUDA out of memory. Tried to allocate 2.00 GiB.")
    assert "lower trainer.max_token_len_per_micro_batch (now 4096)" in msg and "gradient_checkpointing" not in msg
    assert "--resume" in msg

    ledger = Ledger(engine.paths.buffer_dir, "trainer", create=False)
    handed_out = sorted(ledger.pending().column("eid").to_pylist())
    assert len(handed_out) == cfg.train_batch_size and ledger.committed().num_rows == 0
    again = BufferConsumer(engine.paths.buffer_dir, "trainer", resume_step=0)  # what --resume does
    assert sorted(e.eid for e in again.read(cfg.train_batch_size, timeout_s=5)) == handed_out


def test_out_of_memory_is_recognised_through_wrappers():
    from trinity_like.trainer.role import out_of_memory

    cpu = RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: "
                       "you tried to allocate 4952064 bytes. Error code 12 (Cannot allocate memory)")
    assert out_of_memory(cpu) and out_of_memory(MemoryError()) and out_of_memory(torch.OutOfMemoryError("x"))
    wrapped = RuntimeError("worker 1 failed")
    wrapped.__cause__ = torch.OutOfMemoryError("CUDA out of memory")
    assert out_of_memory(wrapped)
    from ray.exceptions import RayTaskError  # a data-parallel worker's step, as the trainer role receives it

    assert out_of_memory(RayTaskError("call", "Traceback ...", torch.OutOfMemoryError("CUDA out of memory"))
                         .as_instanceof_cause())
    assert not out_of_memory(RuntimeError("shape mismatch")) and not out_of_memory(ValueError("out of memory"))


# ---------------------------------------------------------------- full disk


@pytest.fixture
def small_disk(small_disk_of):
    """A real 32 MiB tmpfs (tests/conftest.py ``SmallDisk``; skipped where mounting is refused): its folder."""
    return small_disk_of("32m").path


def test_a_checkpoint_on_a_full_disk_keeps_the_previous_one(make_trainer, batch_exps, small_disk):
    t = make_trainer(name="disk")
    root = t.paths.checkpoint_dir
    assert str(root).startswith(str(small_disk))
    t.train_step(batch_exps)
    first = t.save_checkpoint()
    filler = small_disk / "filler"
    st = os.statvfs(small_disk)
    with open(filler, "wb") as fh:
        os.posix_fallocate(fh.fileno(), 0, st.f_bavail * st.f_frsize - (64 << 10))

    t.train_step(batch_exps)
    with pytest.raises(DiskFullError) as err:
        t.save_checkpoint()
    msg = str(err.value)
    for needle in (str(root / "step_2"), "no space left", "--resume"):
        assert needle in msg, msg
    assert sorted(p.name for p in root.iterdir()) == ["latest", "step_1"]  # no temporary folder left
    assert read_pointer(root / "latest") == 1
    assert resume_checkpoint(root) == (first, [])  # intact by its checksums

    filler.unlink()
    assert t.save_checkpoint() == root / "step_2"
    assert read_pointer(root / "latest") == 2 and resume_checkpoint(root) == (root / "step_2", [])


def test_the_monitor_moves_latest_back_to_a_fallback_step(tmp_path):
    """After a resume skipped damaged step_4 for step_2, the run's CheckpointMonitor (which read `latest` = 4 when
    it started) moves the pointer back, and the next checkpoint (step 3 < 4) moves it on again."""
    from trinity_like.runtime.checkpoints import write_pointer
    from trinity_like.synchronizer.monitor import CheckpointMonitor

    write_pointer(tmp_path / "latest", 4)
    monitor = CheckpointMonitor(checkpoint_dir=str(tmp_path))
    monitor.rollback(2)
    assert read_pointer(tmp_path / "latest") == 2
    monitor.update_latest_checkpoint_step(3)
    assert read_pointer(tmp_path / "latest") == 3
