"""Colocated start-up in order (issue 35, item 5): engines that share GPUs with the trainer set up first."""

from trinity_like.config import load_config
from trinity_like.launcher import setup_order


def _cfg(tmp_path, *overrides):
    return load_config(None, [f"checkpoint_root_dir={tmp_path}", *overrides])


def test_engines_sharing_gpus_with_the_trainer_start_before_it(tmp_path):
    shared = ("trainer.gpus_per_worker=0.5", "explorer.gpus_per_engine=0.5")
    assert setup_order(_cfg(tmp_path, *shared), explores=True, trains=True) == [("explorer",), ("trainer",)]
    # a whole GPU each, or no GPU on one side: nothing shared, both start at once
    for overrides in (("trainer.gpus_per_worker=1", "explorer.gpus_per_engine=1"),
                      ("trainer.gpus_per_worker=0", "explorer.gpus_per_engine=0.5"), ()):
        assert setup_order(_cfg(tmp_path, *overrides), True, True) == [("explorer", "trainer")]
    # one role of the job: nothing to order
    assert setup_order(_cfg(tmp_path, *shared), explores=False, trains=True) == [("trainer",)]
    assert setup_order(_cfg(tmp_path, *shared), explores=True, trains=False) == [("explorer",)]


def test_an_explorer_that_waits_for_the_trainers_run_cannot_go_first(tmp_path):
    """An explorer without the run directory (Redis transport, weights not from files) takes the run from the
    trainer, so it cannot set up before it: both start together (the fixed KV cache size covers this case)."""
    cfg = _cfg(tmp_path, "trainer.gpus_per_worker=0.5", "explorer.gpus_per_engine=0.5", "buffer.transport=redis",
               "synchronizer.method=memory")
    assert setup_order(cfg, True, True) == [("explorer", "trainer")]
