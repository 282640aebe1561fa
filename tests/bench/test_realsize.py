"""bench/realsize.py's pieces (its ``--smoke`` runs in test_smoke.py): the batch's lengths, the padding share, and
the reconstruction of the trainer before commit 4462d03 that the bench compares against: each undone change
does what the old code did, computes the same log-probs, and is put back afterwards."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))  # the scripts import bench/benchlib.py as their neighbour

import realsize  # noqa: E402

from trinity_like.common.tiny_model import make_tiny_model  # noqa: E402
from trinity_like.trainer import ppo  # noqa: E402
from trinity_like.trainer.batch import ResponseScorer, experiences_to_batch  # noqa: E402
from trinity_like.trainer.ppo import PPOTrainer  # noqa: E402


def test_lengths_are_seeded_long_tailed_and_in_bounds():
    prompts, responses = realsize.sample_lengths(32, 1024, 50, 200, seed=3)
    assert (prompts, responses) == realsize.sample_lengths(32, 1024, 50, 200, seed=3)
    assert (prompts, responses) != realsize.sample_lengths(32, 1024, 50, 200, seed=4)
    assert all(50 <= p <= 200 for p in prompts)
    long = [r for r in responses if r > 512]
    assert len(long) == 32 // 8 and all(896 <= r <= 1024 for r in long)  # a few near the limit
    short = [r for r in responses if r <= 512]
    assert all(r >= 8 for r in short) and sorted(short)[len(short) // 2] < 200  # most short


def test_padding_share_counts_the_whole_batch_layout():
    # rows (2 + 1) and (4 + 3): 10 real tokens; the layout is 2 x (4 + 3) = 14, so 4 padded: 4 / 10
    assert realsize.padding_share([2, 4], [1, 3]) == (0.4, 10, 14)


@pytest.fixture(scope="module")
def trainer_and_batch(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("realsize")
    model = make_tiny_model(tmp / "tiny", hidden=32, layers=1)
    args = realsize.parse_args(["--smoke"])
    cfg = realsize.config_for(args, model, str(tmp))
    trainer = PPOTrainer(cfg)
    trainer.prepare()
    prompts, responses = realsize.sample_lengths(8, 48, 4, 12, seed=0)
    exps = realsize.make_experiences(prompts, responses, trainer.module.config.vocab_size)
    return trainer, experiences_to_batch(exps, trainer.pad_token_id)


def _proximal(trainer, batch) -> torch.Tensor:
    return trainer._score_all(trainer.scorer, batch, 1.0) * batch["response_mask"]  # (B, R), zero on padding


@pytest.mark.parametrize("variant", [v for v in realsize.VARIANTS if v != "after"])
def test_each_variant_computes_the_same_log_probs_and_is_undone_after(trainer_and_batch, variant):
    trainer, batch = trainer_and_batch
    expected = _proximal(trainer, batch)
    originals = (ppo.trim, PPOTrainer._micro_batches, PPOTrainer._in_micro_batches, ResponseScorer.forward)
    with realsize.undone(realsize.VARIANTS[variant]):
        got = _proximal(trainer, batch)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
    assert (ppo.trim, PPOTrainer._micro_batches, PPOTrainer._in_micro_batches, ResponseScorer.forward) == originals


def test_the_old_micro_batches_are_in_order_slices_of_the_full_width(trainer_and_batch):
    trainer, batch = trainer_and_batch  # the smoke's micro-batches of 2 rows
    assert [len(p) for p in trainer._micro_batches(batch)] == [2, 2, 2, 2]
    with realsize.undone(("trim",)):
        parts = trainer._micro_batches(batch)
        assert parts == [slice(0, 2), slice(2, 4), slice(4, 6), slice(6, 8)]
        assert ppo.trim(batch[parts[0]])["input_ids"].shape[1] == batch["input_ids"].shape[1]
        tokens = realsize.computed_tokens(trainer, batch, ("trim",))
    assert tokens["update_tokens"] == batch["input_ids"].numel()
    assert realsize.computed_tokens(trainer, batch, ())["update_tokens"] < batch["input_ids"].numel()


def test_the_old_head_scores_every_response_position_and_the_new_one_real_tokens(trainer_and_batch):
    trainer, batch = trainer_and_batch
    seen: list[int] = []
    head = trainer.module.get_output_embeddings()
    handle = head.register_forward_hook(lambda module, inputs, output: seen.append(inputs[0].shape[0]))
    try:
        with torch.no_grad(), realsize.undone(("no_grad", "head")):
            trainer._score_all(trainer.scorer, batch, 1.0)  # the whole batch at once, in chunks of 32
        old = sum(seen)
        seen.clear()
        with torch.no_grad():
            trainer._score_all(trainer.scorer, batch, 1.0)
    finally:
        handle.remove()
    assert old == batch["responses"].numel()
    assert sum(seen) == int(batch["response_mask"].sum())


def test_the_step_recorder_times_each_part_once_and_nests():
    class FakeMemory:
        def __init__(self):
            self.used, self.high = 100, 100

        def sync(self):
            pass

        def settle(self):
            pass

        def in_use(self):
            return self.used

        def reset_peak(self):
            self.high = self.used

        def peak(self):
            return self.high

    memory = FakeMemory()
    recorder = realsize.StepRecorder(memory)

    def grow(n):
        memory.high = max(memory.high, memory.used + n)

    inner = recorder.wrap("inner", lambda: grow(5))
    outer = recorder.wrap("outer", lambda: (grow(30), inner()))
    seconds, peak, out = recorder.step(lambda x: (outer(), grow(50), x)[-1], "done")
    # outer's peak holds inner's (counted in it, not on its own); the step's is the highest of all: 50
    assert set(recorder.parts) == {"outer"} and recorder.parts["outer"][1] == 30
    assert peak == 50 and seconds >= 0 and out == "done"
