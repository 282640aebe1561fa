"""Every choice backed by a registry is read from it, and the defaults the algorithms share with the config are
stated once."""

import dataclasses

from trinity_like.common.algorithm_params import OffPolicyParams, OverlongBufferParams
from trinity_like.config import Config, ConfigError, allowed_values, load_config


def _choice_fields(cls, prefix=""):
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(f.type if isinstance(f.type, type) else None):
            yield from _choice_fields(f.type, f"{prefix}{f.name}.")
        elif "choices_from" in f.metadata:
            yield f"{prefix}{f.name}", f.metadata["choices_from"]
    for f in dataclasses.fields(cls):
        value = f.default_factory() if f.default_factory is not dataclasses.MISSING else None
        if dataclasses.is_dataclass(value):
            yield from _choice_fields(type(value), f"{prefix}{f.name}.")


def test_registry_backed_choices_are_the_registries_names():
    import trinity_like.algorithms as algorithms
    from trinity_like.algorithms.losses import KL_LOSS_TYPES, KL_PENALTIES
    from trinity_like.algorithms.rewards import REWARD_MANAGERS
    from trinity_like.buffer.reader import POLICIES
    from trinity_like.common.tasks import TASKSET_GENERATORS
    from trinity_like.trainer.parallel import STRATEGIES
    from trinity_like.trainer.ppo import TRAINERS
    from trinity_like.weights.publish import PUBLISHERS

    fields = dict(_choice_fields(Config))
    expected = {
        "algorithm.adv_estimator": algorithms.ADV_ESTIMATORS.names(),
        "algorithm.policy_loss": algorithms.POLICY_LOSSES.names(),
        "algorithm.off_policy.correction": algorithms.OFF_POLICY_CORRECTIONS.names(),
        "algorithm.kl_loss_type": KL_LOSS_TYPES, "algorithm.kl_penalty": KL_PENALTIES,
        "reward.manager": tuple(REWARD_MANAGERS), "buffer.read_policy": POLICIES,
        "explorer.taskset.generate": tuple(TASKSET_GENERATORS), "trainer.type": TRAINERS.names(),
        "trainer.strategy": STRATEGIES, "synchronizer.method": PUBLISHERS.names(),
    }
    for key, names in expected.items():
        assert key in fields, f"{key} is not backed by a registry"
        assert allowed_values({"choices_from": fields[key]}) == tuple(names), key


def test_a_name_outside_the_registry_is_refused_naming_the_valid_ones():
    try:
        load_config(None, ["algorithm.kl_loss_type=k9"])
    except ConfigError as e:
        assert "k3+" in str(e) and "kl_loss_type" in str(e)
    else:
        raise AssertionError("k9 was accepted")


def test_shared_defaults_are_stated_once():
    cfg = Config()
    assert (cfg.algorithm.off_policy.cap, cfg.algorithm.off_policy.low, cfg.algorithm.off_policy.high) == \
        (OffPolicyParams().cap, OffPolicyParams().low, OffPolicyParams().high)
    ob = cfg.reward.overlong_buffer
    assert (ob.enable, ob.len, ob.penalty_factor) == (OverlongBufferParams().enable, OverlongBufferParams().len,
                                                      OverlongBufferParams().penalty_factor)


def test_every_registry_backed_default_is_registered():
    # validation skips defaults (their registries may pull in torch), so this is their check
    defaults = Config()
    for key, source in _choice_fields(Config):
        value = defaults
        for part in key.split("."):
            value = getattr(value, part)
        assert value in allowed_values({"choices_from": source}), f"the default of {key} ({value!r}) is not registered"


def test_loading_a_config_with_default_choices_does_not_import_torch(tmp_path):
    import subprocess
    import sys

    code = ("import sys; from trinity_like.config import load_config; "
            "load_config(None, ['trainer.total_steps=3', 'algorithm.kl_loss_type=low_var_kl']); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False", out.stderr


def test_the_earlier_name_of_the_broadcast_method_is_taken_with_a_warning(caplog):
    import logging

    from trinity_like.config import load_config

    with caplog.at_level(logging.WARNING):
        cfg = load_config(None, ["synchronizer.method=nccl"])
    assert cfg.synchronizer.method == "broadcast"
    assert "synchronizer.method nccl is now called broadcast: its rounds run over gloo" in caplog.text
