"""The launcher's run-directory rules for roles joining a run (no Ray needed)."""

import pytest

from trinity_like.common.errors import RunError
from trinity_like.config import load_config
from trinity_like.runtime.paths import RunPaths, read_run_id
from trinity_like.runtime.run_dir import config_differences, prepare_run_dir


def _cfg(tmp_path, model_path, *overrides):
    return load_config(None, [f"checkpoint_root_dir={tmp_path}", f"model.path={model_path}", "project=l",
                              "name=join", "explorer.taskset.size=8", *overrides])


def test_a_joining_role_must_bring_the_runs_config(tmp_path, tiny_model_path):
    first = _cfg(tmp_path, tiny_model_path, "trainer.optimizer.lr=0.01")
    paths = prepare_run_dir(first, role="trainer")
    run_id = read_run_id(paths)
    assert run_id and paths.config.is_file()
    # per-job resources may differ; the run's id stays the first role's
    prepare_run_dir(_cfg(tmp_path, tiny_model_path, "trainer.optimizer.lr=0.01", "explorer.num_engines=3"),
                    role="explorer")
    assert read_run_id(paths) == run_id
    other = _cfg(tmp_path, tiny_model_path, "trainer.optimizer.lr=0.02", "seed=3")
    with pytest.raises(RunError, match=r"runs another config \(differs in seed, trainer\.optimizer\.lr\)"):
        prepare_run_dir(other, role="explorer")
    assert load_config(paths.config).trainer.optimizer.lr == 0.01  # the saved config was not touched
    assert config_differences(first, other) == ["seed", "trainer.optimizer.lr"]


def test_roles_refuse_a_finished_run_or_checkpoints_without_resume(tmp_path, tiny_model_path):
    cfg = _cfg(tmp_path, tiny_model_path)
    paths = prepare_run_dir(cfg, role="all")
    (paths.checkpoint_dir / "step_2").mkdir(parents=True)
    (paths.checkpoint_dir / "step_2" / "trainer_state.json").write_text('{"step": 2}')
    (paths.checkpoint_dir / "latest").write_text("2\n")
    with pytest.raises(RunError, match="holds trainer checkpoints .*step_2.*--resume"):
        prepare_run_dir(cfg, role="trainer")
    with pytest.raises(RunError, match="already holds a run; continue it with --resume"):
        prepare_run_dir(cfg, role="all")
    prepare_run_dir(cfg, role="explorer")  # an explorer joins whatever is there
    assert prepare_run_dir(cfg, role="trainer", resume=True) == RunPaths.of(cfg)
    with pytest.raises(RunError, match="bad role 'judge'"):
        prepare_run_dir(cfg, role="judge")


def test_a_run_may_start_on_a_buffer_that_holds_only_imported_rows(tmp_path, tiny_model_path):
    """Demonstrations ingested (or agent rows committed) before the first start are data for the run; rows an
    explorer wrote mean a run already happened there."""
    from trinity_like.buffer import BufferWriter
    from trinity_like.common.experience import Experience

    cfg = _cfg(tmp_path, tiny_model_path)
    paths = RunPaths.of(cfg)
    row = Experience(prompt_ids=[1, 2], response_ids=[3], source="human", reward=1.0)
    BufferWriter(paths.buffer_dir, writer_id="ingest-human").write([row])
    BufferWriter(paths.buffer_dir, writer_id="serve").write([Experience(prompt_ids=[1], response_ids=[2],
                                                                        source="agent")])
    assert prepare_run_dir(cfg, role="all") == paths
    BufferWriter(paths.buffer_dir, writer_id="explorer").write([Experience(prompt_ids=[1], response_ids=[2])])
    with pytest.raises(RunError, match="already holds a run"):
        prepare_run_dir(cfg, role="all")
