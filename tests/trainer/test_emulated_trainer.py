"""The EMULATED trainer (``trainer.type: emulated``, trinity_like/trainer/emulated.py): its step sleeps the time the
formula gives, its versions go out through the real publishers and read back with their fingerprints, and its
checkpoints resume. EMULATION: it learns nothing; these tests check the timing and the plumbing only."""

from __future__ import annotations

import time

import numpy as np
import pytest

from trinity_like.common.experience import Experience
from trinity_like.config import load_config
from trinity_like.trainer.emulated import EmulatedTrainer, emulated_step_seconds, staleness_metrics


def _config(tmp_path, model, *overrides):
    return load_config(None, [f"checkpoint_root_dir={tmp_path}", f"model.path={model}", "trainer.type=emulated",
                              "explorer.engine=emulated", *overrides])


def _rows(n: int, prompt: int, response: int, version: int = 0) -> list[Experience]:
    return [Experience(prompt_ids=np.ones(prompt, dtype=np.int64), response_ids=np.ones(response, dtype=np.int64),
                       group_id=f"g{i // 4}", reward=float(i % 2), model_version=version) for i in range(n)]


def test_the_config_and_the_trainer_role_find_it(tmp_path, tiny_model_path):
    from trinity_like.trainer.ppo import TRAINERS  # the registry config validation reads
    from trinity_like.trainer.role import make_train_engine

    assert TRAINERS.get("emulated") is EmulatedTrainer
    assert isinstance(make_train_engine(_config(tmp_path, tiny_model_path)), EmulatedTrainer)


def test_step_time_formula_by_hand():
    # 8 rows x (51 + 200) tokens = 2008 tokens; 4 workers at 1e-3 s a token: 0.502 s, + 0.1 s all-reduce
    assert emulated_step_seconds(2008, 1e-3, 4, 0.1) == pytest.approx(0.602)
    assert emulated_step_seconds(2008, 1e-3, 1, 0.1) == pytest.approx(2.008)  # one worker: no all-reduce


@pytest.mark.parametrize("workers,allreduce,expected", [(1, 0.0, 0.48), (2, 0.1, 0.34)])
def test_a_step_sleeps_tokens_over_workers_times_s_per_token(tmp_path, tiny_model_path, workers, allreduce,
                                                             expected):
    cfg = _config(tmp_path, tiny_model_path, "trainer.emulated.s_per_token=1e-3",
                  f"trainer.emulated.workers={workers}", f"trainer.emulated.allreduce_s={allreduce}",
                  "explorer.emulated.prompt_tokens=10")
    trainer = EmulatedTrainer(cfg)
    trainer.prepare()
    batch = _rows(8, 3, 50)  # 8 x (10 emulated prompt tokens, not the 3 carried, + 50) = 480 tokens
    start = time.perf_counter()
    m = trainer.train_step(batch)
    took = time.perf_counter() - start
    assert m["emulated/tokens"] == 480 and m["emulated/sleep_s"] == pytest.approx(expected)
    assert expected <= took < expected + 0.15 and m["time/train_step_s"] == pytest.approx(took, abs=0.01)
    assert m["train/batch_size"] == 8 and trainer.train_step_num == 1
    assert m["train/reward_mean"] == 0.5 and m["train/response_length_mean"] == 50


def test_staleness_metrics_as_the_real_trainer_counts_them():
    rows = _rows(4, 3, 2, version=1)
    rows[1].model_version = 3
    rows[2].model_version = -1  # not this run's policy: 0
    rows[3] = Experience(prompt_ids=np.ones(3), response_ids=np.ones(2), model_version=1,
                         token_versions=np.array([1, 2]))
    m = staleness_metrics(rows, step=3)
    assert m["train/staleness_mean"] == pytest.approx((2 + 0 + 0 + 2) / 4) and m["train/staleness_max"] == 2
    assert m["train/staleness_frac/0"] == 0.5 and m["train/staleness_frac/2"] == 0.5
    # tokens: 2, 2 | 0, 0 | 0, 0 | 2, 1
    assert m["train/token_staleness_mean"] == pytest.approx(7 / 8)


def test_tokens_past_the_training_bound_are_masked_as_the_real_trainer_masks_them():
    # step 7, max_staleness 2: bound 5; slack 1: tokens older than 4 are masked in rows that keep a token
    rows = [Experience(prompt_ids=np.ones(2), response_ids=np.ones(3), model_version=3,
                       token_versions=np.array([3, 4, 4])),  # 3 masked, 4s trained (staleness 3)
            Experience(prompt_ids=np.ones(2), response_ids=np.ones(2), model_version=6)]  # trained (staleness 1)
    m = staleness_metrics(rows, step=7, bound=5, train_slack=1)
    assert m["train/masked_stale_tokens"] == 1
    assert m["train/token_staleness_mean"] == pytest.approx((3 + 3 + 1 + 1) / 4)
    assert staleness_metrics(rows, step=7, bound=5, train_slack=0)["train/masked_stale_tokens"] == 0


def test_another_engine_is_refused_in_one_line(tmp_path, tiny_model_path):
    from trinity_like.common.errors import UserError

    # at config load (validation), and again where a trainer is built from a config never validated
    with pytest.raises(UserError, match="runs only with explorer.engine emulated"):
        load_config(None, [f"checkpoint_root_dir={tmp_path}", f"model.path={tiny_model_path}",
                           "trainer.type=emulated", "explorer.engine=hf"])
    with pytest.raises(UserError, match="set trainer.num_workers=1 and trainer.emulated.workers=2"):
        _config(tmp_path, tiny_model_path, "trainer.num_workers=2")
    unchecked = _config(tmp_path, tiny_model_path)
    unchecked.explorer.engine = "hf"
    with pytest.raises(UserError, match="runs only with explorer.engine emulated"):
        EmulatedTrainer(unchecked)


def test_each_version_is_published_with_its_own_fingerprint_and_reads_back(tmp_path, tiny_model_path):
    from trinity_like.weights.files import load_version
    from trinity_like.weights.fingerprint import weights_fingerprint

    cfg = _config(tmp_path, tiny_model_path, "trainer.emulated.s_per_token=0", "synchronizer.method=checkpoint")
    trainer = EmulatedTrainer(cfg)
    trainer.prepare()
    seen = []
    for version in (1, 2):
        trainer.train_step(_rows(4, 3, 5))
        vdir = trainer.save_state_dict()  # no monitor: the single writer completes the version itself
        weights, size, fingerprint = load_version(vdir)
        assert trainer.train_step_num == version and size > 0
        assert fingerprint == weights_fingerprint(trainer.weights_for_export())
        assert all(np.array_equal(weights[k].numpy(), v.numpy()) for k, v in trainer.weights_for_export().items())
        seen.append(fingerprint)
    assert seen[0] != seen[1]


def test_a_checkpoint_resumes_the_step_and_the_weights(tmp_path, tiny_model_path):
    from trinity_like.runtime.checkpoints import resume_checkpoint

    cfg = _config(tmp_path, tiny_model_path, "trainer.emulated.s_per_token=0")
    trainer = EmulatedTrainer(cfg)
    trainer.prepare()
    for _ in range(2):
        trainer.train_step(_rows(4, 3, 5))
    trainer.save_checkpoint()
    path, damaged = resume_checkpoint(trainer.paths.checkpoint_dir)
    assert path.name == "step_2" and not damaged
    again = EmulatedTrainer(cfg)
    again.prepare()
    again.load_checkpoint(path)
    assert again.train_step_num == 2
    assert all(np.array_equal(again.weights_for_export()[k].numpy(), v.numpy())
               for k, v in trainer.weights_for_export().items())
    again.train_step(_rows(4, 3, 5))
    trainer.train_step(_rows(4, 3, 5))  # step 3 of both: the same bytes (seeded by seed and step)
    assert all(np.array_equal(again.weights_for_export()[k].numpy(), v.numpy())
               for k, v in trainer.weights_for_export().items())


def test_a_real_trainer_checkpoint_is_refused_in_one_line(tmp_path, tiny_model_path):
    import json

    from trinity_like.common.errors import UserError

    ckpt = tmp_path / "step_1"
    (ckpt / "model").mkdir(parents=True)
    (ckpt / "trainer_state.json").write_text(json.dumps({"step": 1, "kl_coef": 0.0, "strategy": "single"}))
    trainer = EmulatedTrainer(_config(tmp_path, tiny_model_path))
    trainer.prepare()
    with pytest.raises(UserError, match="written by a real trainer"):
        trainer.load_checkpoint(ckpt)
