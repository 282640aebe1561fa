import subprocess
import sys
from pathlib import Path

import pytest

from trinity_like.config import Config, ConfigError, load_config, to_yaml
from trinity_like.runtime.paths import RunPaths

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "configs" / "quickstart.yaml"


def test_quickstart_loads_with_overrides():
    cfg = load_config(QUICKSTART, ["trainer.total_steps=7", "mode=sync", "explorer.sampling.temperature=0.5"])
    assert isinstance(cfg, Config)
    assert cfg.trainer.total_steps == 7
    assert cfg.mode == "sync"
    assert cfg.explorer.sampling.temperature == 0.5
    assert cfg.project == "quickstart"  # from the YAML, untouched
    assert cfg.train_batch_size == cfg.explorer.batch_size * cfg.explorer.repeat_times


def test_defaults_without_file_and_yaml_round_trip(tmp_path):
    cfg = load_config(None, ["trainer.batch_size=8"])
    assert cfg.train_batch_size == 8
    saved = tmp_path / "c.yaml"
    saved.write_text(to_yaml(cfg))
    assert load_config(saved) == cfg


def test_run_paths_follow_project_and_name(tmp_path):
    cfg = load_config(None, [f"checkpoint_root_dir={tmp_path}", "project=p", "name=n"])
    paths = RunPaths.of(cfg)
    assert paths.run_dir == tmp_path / "p" / "n"
    assert paths.buffer_dir == tmp_path / "p" / "n" / "buffer"


@pytest.mark.parametrize(
    "override, needle",
    [
        ("trainer.total_stepz=3", "unknown config key 'trainer.total_stepz'"),
        ("bogus=1", "unknown config key 'bogus'"),
        ("mode=turbo", "allowed values: sync, async, offline"),
        ("explorer.engine=tpu", "allowed values: hf, vllm"),
        ("trainer.total_steps=many", "bad value for 'trainer.total_steps'"),
        ("trainer.total_steps=0", "must be at least 1"),
        ("explorer.sampling.top_p=1.5", "must be at most 1.0"),
        ("algorithm.adv_estimator=magic", "allowed values: dapo, gae, grpo, opmd"),
        ("trainer.batch_size=6", "not a multiple of explorer.repeat_times"),
        ("synchronizer.interval=3", "max_staleness"),
        ("explorer.call_timeout_s=700", "explorer.call_timeout_s=700 must be below explorer.task_timeout_s=600"),
    ],
)
def test_bad_config_names_the_key(override, needle):
    with pytest.raises(ConfigError) as err:
        load_config(QUICKSTART, [override])
    assert needle in str(err.value)
    assert "\n" not in str(err.value)


def test_unknown_key_lists_valid_keys():
    with pytest.raises(ConfigError) as err:
        load_config(None, ["synchronizer.methd=memory"])
    assert "valid keys under 'synchronizer': method, interval, offset, style, max_staleness" in str(err.value)


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "trinity_like.cli", *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)


def test_cli_config_error_is_one_line_exit_2():
    proc = _cli("run", str(QUICKSTART), "mode=turbo")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert lines == ["error: bad value for 'mode': 'turbo'; allowed values: sync, async, offline"]
    assert "Traceback" not in proc.stderr


def test_cli_missing_config_file_exit_2(tmp_path):
    proc = _cli("run", str(tmp_path / "nope.yaml"))
    assert proc.returncode == 2
    assert "does not exist" in proc.stderr and "Traceback" not in proc.stderr


def test_cli_config_flags_and_overrides_in_any_order():
    proc = _cli("run", "mode=sync", "--print-config", str(QUICKSTART), "trainer.total_steps=5")
    assert proc.returncode == 0, proc.stderr
    assert "mode: sync" in proc.stdout and "total_steps: 5" in proc.stdout
    proc = _cli("run", "--print-config", "trainer.total_steps=4", str(QUICKSTART))
    assert proc.returncode == 0, proc.stderr
    assert "total_steps: 4" in proc.stdout and "mode: async" in proc.stdout


def test_cli_two_config_files_is_an_error():
    proc = _cli("run", str(QUICKSTART), str(QUICKSTART))
    assert proc.returncode == 2 and "exactly one CONFIG" in proc.stderr


def test_cli_bad_task_file_is_one_line_exit_2(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    bad = tmp_path / "tasks.parquet"
    pq.write_table(pa.table({"task_id": ["1"], "question": ["1+1="]}), bad)
    proc = _cli("run", str(QUICKSTART), f"checkpoint_root_dir={tmp_path}", f"explorer.taskset.path={bad}",
                f"model.path={tmp_path / 'no-model'}")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("error: model.path")
    proc = _cli("run", str(QUICKSTART), f"checkpoint_root_dir={tmp_path}", f"explorer.taskset.path={bad}",
                "name=badtasks")
    assert proc.returncode == 2, proc.stderr
    assert "lacks column(s) prompt, answer" in proc.stderr and "Traceback" not in proc.stderr


def test_scalar_where_a_section_belongs():
    with pytest.raises(ConfigError, match="'explorer.sampling' is a section, not a value; set its keys instead"):
        load_config(QUICKSTART, ["explorer.sampling=3"])


def test_yaml_errors_are_reported(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("mode: [unclosed\n")
    with pytest.raises(ConfigError, match="is not valid YAML"):
        load_config(bad)
    typo = tmp_path / "typo.yaml"
    typo.write_text("trainer:\n  totl_steps: 3\n")
    with pytest.raises(ConfigError, match="unknown config key 'trainer.totl_steps'"):
        load_config(typo)
    with pytest.raises(ConfigError, match="not of the form key=value"):
        load_config(None, ["mode"])


@pytest.mark.parametrize(
    "overrides, needle",
    [
        (["algorithm.off_policy.correction=vtrace"], "allowed values: decoupled, geo_mask"),
        (["algorithm.policy_loss=dpo"], "set explorer.repeat_times=2"),
        (["algorithm.policy_loss=dpo", "explorer.repeat_times=2", "trainer.micro_batch_size=3"], "never split"),
        (["reward.function_path=/no/such/reward.py"], "does not exist"),
        (["reward.manager=dapo", "reward.overlong_buffer.enable=true", "reward.overlong_buffer.len=99",
          "explorer.sampling.max_new_tokens=10"], "must be in (0, 10]"),
        (["buffer.read_policy=priority"], "needs buffer.priority"),
        (["buffer.replay_max_uses=3"], "needs buffer.read_policy=replay"),
        (["explorer.eval_tasksets=[{name: a, k: 4}]"], "greedy samples are all the same"),
        (["explorer.eval_tasksets=[{name: a}, {name: a}]"], "names must be unique"),
    ],
)
def test_cross_field_rules(overrides, needle):
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_remax_is_accepted():
    # the explorer's single_turn workflow produces its greedy baselines (info["reward_baseline"])
    assert load_config(None, ["algorithm.adv_estimator=remax"]).algorithm.adv_estimator == "remax"


def test_a_list_element_override_is_a_config_error_not_a_crash():
    with pytest.raises(ConfigError, match="set a list as a whole"):
        load_config(Path(__file__).parents[2] / "configs" / "quickstart.yaml",
                    ["explorer.eval_tasksets.0.max_operand=6"])


@pytest.mark.parametrize(("override", "message"), [
    ("explorer.node.resources={GPU: 1}", "built-in resource 'GPU'; it is for custom resources of `ray start "
                                         "--resources` (GPUs: explorer.gpus_per_engine)"),
    ("trainer.node.resources={CPU: 2}", "trainer.node.resources names Ray's built-in resource 'CPU'"),
    ("synchronizer.node.resources={head: 0}", "'synchronizer.node.resources.head': 0.0; give the amount each actor "
                                              "asks for, above 0"),
    ("explorer.node.labels={pool: ''}", "'explorer.node.labels.pool': ''; give the label's value as a non-empty "
                                        "string"),
])
def test_a_node_placement_with_builtin_resources_or_empty_values_is_refused(override, message):
    with pytest.raises(ConfigError) as err:
        load_config(None, [override])
    assert message in str(err.value)


def test_node_placement_loads_from_overrides():
    cfg = load_config(None, ["explorer.node.resources={rollout_node: 0.01}", "explorer.node.labels={pool: rollout}"])
    assert cfg.explorer.node.resources == {"rollout_node": 0.01} and cfg.explorer.node.labels == {"pool": "rollout"}
    assert cfg.trainer.node.resources == {} and cfg.synchronizer.node.labels == {}
