"""Tokens older than the training bound (``synchronizer.train_slack``) leave the loss: a row with some stale tokens
trains exactly as the same row with those tokens outside its mask (gradient, loss and normaliser alike)."""

import pytest
import torch

from trinity_like.common.experience import Experience
from trinity_like.trainer.batch import experiences_to_batch, mask_stale_tokens


def _rows(first_versions: list[int], first_mask: list[bool] | None = None) -> list[Experience]:
    """One group of three rows; the first one's tokens carry ``first_versions`` (and ``first_mask``). No stored
    log-probs: the trainer scores them, so every ratio starts at 1 and every token has a gradient (made-up
    log-probs would put the ratios outside the clip range, where a token's gradient is 0 either way)."""
    def row(i, response, versions, mask=None):
        return Experience(prompt_ids=[5, 6, 7], response_ids=response, group_id="g", eid=f"g-{i}", reward=float(i),
                          model_version=versions[0], token_versions=versions, action_mask=mask)

    return [row(0, [11, 12, 13, 14], first_versions, first_mask), row(1, [15, 16, 17], [2, 2, 2]),
            row(2, [18, 19], [1, 2])]


def _step_at_version_3(make_trainer, name: str, rows: list[Experience], *overrides: str):
    """A trainer (mode async, max_staleness 1) brought to version 3 by three steps on fresh rows, then one step on
    ``rows``; returns its metrics and its weights after that step. (At max_staleness 0 the slack does not apply:
    async is sync there, ``runtime.schedule.train_slack``.)"""
    t = make_trainer("mode=async", "synchronizer.max_staleness=1", "trainer.optimizer.lr=0.01", *overrides, name=name)
    warm = [Experience(prompt_ids=[5, 6], response_ids=[20 + i, 21], group_id="w", logprobs=[-1.0, -1.0],
                       reward=float(i), model_version=v) for v in (0, 1, 2) for i in range(3)]
    for k in range(3):
        t.train_step(warm[3 * k:3 * k + 3])
    assert t.train_step_num == 3
    metrics = t.train_step(rows)
    return metrics, {k: v.detach().clone() for k, v in t.module.state_dict().items()}


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_stale_tokens_train_as_tokens_outside_the_mask(make_trainer, agg):
    # at version 3 with max_staleness 1 and train_slack 1, tokens of version >= 1 are trained: the first row's
    # two version-0 tokens are masked, its version-2 ones trained (and row 2's version-1 token too)
    agg_kw = f"algorithm.loss_agg_mode={agg}"
    stale, w_stale = _step_at_version_3(make_trainer, "stale", _rows([0, 0, 2, 2]), "synchronizer.train_slack=1",
                                        agg_kw)
    masked, w_masked = _step_at_version_3(make_trainer, "masked", _rows([0, 0, 2, 2], [False, False, True, True]),
                                          "synchronizer.train_slack=1", agg_kw)
    # the same rows with nothing masked (a slack reaching version 0) train differently: the test can fail
    kept, w_kept = _step_at_version_3(make_trainer, "kept", _rows([0, 0, 2, 2]), "synchronizer.train_slack=2", agg_kw)
    assert stale["train/masked_stale_tokens"] == 2.0
    assert masked["train/masked_stale_tokens"] == 0.0 and kept["train/masked_stale_tokens"] == 0.0
    # the normaliser counts only the trained tokens: the same loss, the same gradient, the same weights after
    assert stale["actor/pg_loss"] == pytest.approx(masked["actor/pg_loss"], rel=1e-6, abs=1e-9)
    assert stale["actor/grad_norm"] == pytest.approx(masked["actor/grad_norm"], rel=1e-6)
    assert all(torch.equal(w_stale[k], w_masked[k]) for k in w_stale)
    assert kept["actor/grad_norm"] != pytest.approx(stale["actor/grad_norm"], rel=1e-3)
    assert not all(torch.equal(w_stale[k], w_kept[k]) for k in w_stale)


def test_slack_zero_masks_nothing(make_trainer):
    """With train_slack 0 the engine trains whatever rows it is given whole (the reader dropped the stale ones),
    as before the slack existed."""
    zero, w_zero = _step_at_version_3(make_trainer, "zero", _rows([0, 0, 2, 2]), "synchronizer.train_slack=0")
    kept, w_kept = _step_at_version_3(make_trainer, "kept", _rows([0, 0, 2, 2]), "synchronizer.train_slack=2")
    assert zero["train/masked_stale_tokens"] == 0.0
    assert zero["actor/grad_norm"] == pytest.approx(kept["actor/grad_norm"], rel=1e-6)
    assert all(torch.equal(w_zero[k], w_kept[k]) for k in w_zero)


def test_the_mask_by_hand():
    # bound 3 (e.g. version 5, max_staleness 2), slack 1: tokens of version >= 2 are trained
    rows = [Experience(prompt_ids=[1], response_ids=[4, 5, 6, 7], model_version=1, token_versions=[1, 1, 2, 3]),
            Experience(prompt_ids=[1], response_ids=[4, 5], model_version=1, token_versions=[1, 2],
                       action_mask=[False, True]),  # its stale token is outside the mask already: not counted
            Experience(prompt_ids=[1], response_ids=[4, 5, 6], model_version=-1),  # not this run's policy
            Experience(prompt_ids=[1], response_ids=[4], model_version=3),
            Experience(prompt_ids=[1], response_ids=[4, 5], model_version=0, token_versions=[0, 1])]  # none left
    batch = experiences_to_batch(rows, pad_token_id=0)
    assert mask_stale_tokens(batch, bound=3, train_slack=1) == 2
    assert batch["response_mask"].tolist() == [[0, 0, 1, 1], [0, 1, 0, 0], [1, 1, 1, 0], [1, 0, 0, 0],
                                               [1, 1, 0, 0]]  # the last: never from the reader, trained as given
    # slack 2 reaches version 1: the first row's version-1 tokens are back, the last row is kept, its version-0 token
    # masked
    again = experiences_to_batch(rows, pad_token_id=0)
    assert mask_stale_tokens(again, bound=3, train_slack=2) == 1
    assert again["response_mask"][0].tolist() == [1, 1, 1, 1] and again["response_mask"][4].tolist() == [0, 1, 0, 0]
