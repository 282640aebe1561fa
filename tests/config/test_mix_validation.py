"""`algorithm.sft_loss_form: mix` ((1 - mu) pg + mu sft, Trinity-RFT's mix) is refused at load where it cannot mean
what it says: no expert rows named, or a mu that leaves no (or a negative) policy-gradient weight."""

from __future__ import annotations

import pytest

from trinity_like.common.errors import ConfigError
from trinity_like.config import load_config


@pytest.mark.parametrize("overrides, says", [
    (["algorithm.sft_loss_form=mix"], "algorithm.sft_sources is empty"),
    (["algorithm.sft_loss_form=mix", "algorithm.sft_sources=[human]"], "leaves no policy loss"),  # the 1.0 default
    (["algorithm.sft_loss_form=mix", "algorithm.sft_sources=[human]", "algorithm.sft_loss_coef=1.5"],
     "must be in [0, 1]"),
])
def test_mix_form_refused_where_it_cannot_mean_mix(overrides, says):
    with pytest.raises(ConfigError, match=None) as e:
        load_config(None, overrides)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_mix_form_with_a_mu_below_one_loads():
    cfg = load_config(None, ["algorithm.sft_loss_form=mix", "algorithm.sft_sources=[human]",
                             "algorithm.sft_loss_coef=0.1"])
    assert cfg.algorithm.sft_loss_form == "mix" and cfg.algorithm.sft_loss_coef == 0.1
