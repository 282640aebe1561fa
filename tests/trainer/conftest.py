import pytest


@pytest.fixture
def make_trainer(tmp_path, tiny_model_path):
    """A prepared PPOTrainer on the tiny model, pinned to the CPU (references here are computed there), in groups
    of 3 unless the overrides say otherwise; ``name`` gives each trainer of a test its own run directory."""
    from trinity_like.config import load_config
    from trinity_like.trainer.ppo import PPOTrainer

    def make(*overrides: str, name: str = "run") -> PPOTrainer:
        cfg = load_config(None, [f"checkpoint_root_dir={tmp_path / name}", f"model.path={tiny_model_path}",
                                 "trainer.device=cpu", "explorer.repeat_times=3", *overrides])
        trainer = PPOTrainer(cfg)
        trainer.prepare()
        return trainer
    return make
