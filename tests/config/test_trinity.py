"""Trinity-RFT-shaped configs (trinity_like/config/trinity.py): detection both ways, every key of Trinity's schema
ruled, Trinity's examples translated or refused in one line, Trinity's defaults where ours differ (a test per row),
modes, overrides, ``${oc.env:...}``, the explore/train pair sharing one run, and config-convert's difference
lines."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import yaml

from trinity_like.cli import main
from trinity_like.common.errors import ConfigError
from trinity_like.config import load_config
from trinity_like.config.loading import load_config_with_translation
from trinity_like.config.trinity import (
    DEFAULTS_WHERE_OURS_DIFFER,
    DOCS_PATH,
    is_trinity_config,
    load_trinity_file,
    render_docs,
    translate,
)
from trinity_like.config.trinity_rules import EXACT, RULES, find_rule, normalise
from trinity_like.config.verl import is_verl_config
from trinity_like.config.verl_compose import ENTRIES, compose_raw
from trinity_like.runtime.paths import RunPaths
from trinity_like.runtime.run_dir import config_differences

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = Path(__file__).parent / "trinity_examples"
VERL_SCRIPTS = Path(__file__).parent / "verl_scripts"


def gsm8k_rows(path: Path, n: int = 20) -> Path:
    """A small local gsm8k-shaped task file: question / answer, answers ending in '#### N'."""
    with open(path, "w") as fh:
        for i in range(n):
            fh.write(json.dumps({"question": f"Tom has {i} apples and buys {i + 1} more. How many now?",
                                 "answer": f"He has {i} + {i + 1} = {2 * i + 1} apples.\n#### {2 * i + 1}"}) + "\n")
    return path


@pytest.fixture
def data(tmp_path) -> Path:
    return gsm8k_rows(tmp_path / "gsm8k.jsonl")


@pytest.fixture
def env(monkeypatch, tmp_path, data):
    """The environment variables Trinity's examples read (model, task set, checkpoint root)."""
    monkeypatch.setenv("TRINITY_MODEL_PATH", "runs/models/tiny")
    monkeypatch.setenv("TRINITY_TASKSET_PATH", str(data))
    monkeypatch.setenv("TRINITY_CHECKPOINT_ROOT_DIR", str(tmp_path / "ckpt"))
    return data


def minimal(data: Path, **extra) -> dict:
    """The smallest Trinity config that translates: a model, a task set (local), lengths."""
    tree = {"model": {"model_path": "runs/models/tiny", "max_model_len": 256},
            "buffer": {"explorer_input": {"taskset": {"path": str(data),
                                                      "format": {"prompt_key": "question",
                                                                 "response_key": "answer"}}}},
            "cluster": {"node_num": 1, "gpu_per_node": 0}}
    for key, value in extra.items():
        node = tree
        *parents, leaf = key.split("__")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return tree


# ---------------------------------------------------------------- detection


def test_every_example_is_detected_as_trinity_and_none_of_ours_or_verls_is():
    examples = sorted(EXAMPLES.rglob("*.yaml"))
    assert len(examples) >= 19
    for path in examples:
        assert is_trinity_config(load_trinity_file(path)), path
    ours = sorted((ROOT / "configs").glob("*.yaml")) + sorted((ROOT / "examples").rglob("*.yaml"))
    assert ours
    for path in ours:
        tree = yaml.safe_load(path.read_text())
        assert not is_trinity_config(tree), path
    for script in sorted(VERL_SCRIPTS.glob("*.txt")):
        lines = [ln.strip() for ln in script.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
        entry = next(e for e in ENTRIES if f"# entry: {e}" in script.read_text())
        _, composed = compose_raw(None, [ln for ln in lines if "=" in ln and not ln.startswith("+")], entry)
        assert is_verl_config(composed) and not is_trinity_config(composed), script
    # a verl file that happens to have a key Trinity also has is still verl's
    assert not is_trinity_config({"data": {"train_files": "x"}, "trainer": {"trainer_type": "verl"}})


def test_every_key_of_trinitys_schema_has_a_rule_and_every_rule_names_a_key_of_it():
    keys = (EXAMPLES / "schema_keys.txt").read_text().split()
    assert len(keys) > 1000  # every dataclass field reachable from Trinity's Config, stages included
    normalised = set()
    for key in keys:
        concrete = key.replace("[]", ".0").replace("<name>", "x")
        norm = normalise(concrete)
        normalised.add(norm)
        assert find_rule(norm) is not None, key
    for rule_key in EXACT:
        assert rule_key in normalised or any(k.startswith(rule_key + ".") or k.startswith(rule_key + "[")
                                             for k in normalised), f"rule {rule_key} names no key of Trinity's"
    kinds = {r.kind for r in RULES}
    assert kinds == {"mapped", "checked", "derived", "no effect"}


def test_docs_trinity_md_is_up_to_date():
    assert DOCS_PATH.read_text() == render_docs(), "docs/trinity.md is out of date; regenerate it with " \
                                                  "`python -m trinity_like.config.trinity`"
    guide = (ROOT / "docs" / "coming-from-trinity.md").read_text()
    for d in DEFAULTS_WHERE_OURS_DIFFER:  # the hand-written guide shows the same table, row for row
        row = f"| `{d.trinity}` | {d.trinity_default} | `{d.ours}` | {d.ours_default} | {d.applied} |"
        assert row in DOCS_PATH.read_text() and row in guide, row


# ---------------------------------------------------------------- the examples


def _translate_example(name: str, *overrides: str):
    return translate(load_trinity_file(EXAMPLES / name), EXAMPLES / name, list(overrides))


@pytest.mark.parametrize("name", ["grpo_gsm8k/gsm8k.yaml", "async_gsm8k/explorer.yaml", "async_gsm8k/trainer.yaml",
                                  "grpo_frozen_lake/frozen_lake.yaml", "mix_math/mix_math.yaml",
                                  "ppo_countdown_exp_replay/countdown.yaml", "ppo_countdown/countdown.yaml",
                                  "opmd_gsm8k/opmd_gsm8k.yaml", "cispo_gsm8k/gsm8k.yaml",
                                  "grpo_lora_gsm8k/gsm8k.yaml", "bench/external_model.yaml",
                                  "template/config.yaml"])
def test_rl_examples_translate_and_load_with_only_env_and_size_overrides(env, monkeypatch, tmp_path, name):
    monkeypatch.setenv("TRINITY_SFT_DATASET_PATH", str(env))
    overrides = ["cluster.gpu_per_node=0", "buffer.batch_size=4", "algorithm.repeat_times=4",
                 "model.max_model_len=256", "model.max_response_tokens=64"]
    if name.startswith("bench/"):
        overrides = ["buffer.batch_size=4", "model.max_model_len=4096"]
    if name.endswith("countdown.yaml") or name.startswith("template/"):
        overrides.append(f"buffer.explorer_input.taskset.path={env}")
    if name == "async_gsm8k/trainer.yaml" or name == "mix_math/mix_math.yaml":
        overrides.append("buffer.train_batch_size=16")
    cfg, tr = load_config_with_translation(EXAMPLES / name, overrides)
    assert tr is not None
    if tr.command == "bench":
        assert cfg.explorer.engine == "external" and cfg.explorer.external_model.model_name == "qwen3-max"
        assert [e.name for e in cfg.explorer.eval_tasksets] == ["gsm8k_eval"]
        return
    assert cfg.model.path == "runs/models/tiny"
    assert cfg.explorer.engine == "hf" and cfg.explorer.batch_size == 4 and cfg.explorer.repeat_times == 4
    assert cfg.explorer.taskset.path == str(env)
    assert cfg.trainer.total_steps >= 1
    assert cfg.explorer.sampling.max_new_tokens == 64


def test_grpo_gsm8k_as_trinity_means_it(env):
    tr = _translate_example("grpo_gsm8k/gsm8k.yaml")
    n = tr.native
    # both, sync_interval 1, sync_offset 0: on-policy lock-step
    assert n["mode"] == "sync" and tr.role == "all" and tr.command == "run"
    # 2 GPUs: one engine (engine_num 1 x tp 1), the trainer the other
    assert (n["explorer.engine"], n["explorer.num_engines"], n["explorer.gpus_per_engine"]) == ("vllm", 1, 1.0)
    assert (n["trainer.num_workers"], n["trainer.gpus_per_worker"]) == (1, 1.0)
    assert n["synchronizer.method"] == "broadcast" and n["synchronizer.sync_timeout_s"] == 1200.0
    # batch_size 96 x repeat_times 8 = train_batch_size 768; 20 local rows, 1 epoch: one explorer step
    assert (n["explorer.batch_size"], n["explorer.repeat_times"], n["trainer.batch_size"]) == (96, 8, 768)
    assert n["trainer.total_steps"] == 1
    assert n["trainer.optimizer.lr"] == 1e-5
    assert n["explorer.sampling.max_new_tokens"] == 1024 and n["explorer.max_prompt_tokens"] == 1024
    assert n["trainer.max_token_len_per_micro_batch"] == 16384
    assert n["explorer.workflow"] == "math_workflow"
    assert n["explorer.taskset.subset_name"] == "main" and n["explorer.taskset.format.prompt_key"] == "question"
    [ev] = n["explorer.eval_tasksets"]
    assert ev["name"] == "gsm8k-eval" and ev["split"] == "test" and ev["workflow"] == "math_workflow"
    assert n["explorer.eval_interval"] == 50 and n["trainer.save_interval"] == 100
    assert n["checkpoint_root_dir"] == str(Path(env).parent / "ckpt")
    assert n["algorithm.adv_estimator"] == "grpo"
    assert any(k == "buffer.trainer_input.experience_buffer.path" and "means nothing here" in why
               for k, _, why in tr.no_effect)  # the queue's sqlite:///gsm8k.db


def test_total_steps_come_from_the_local_task_rows(tmp_path):
    data = gsm8k_rows(tmp_path / "t.jsonl", n=40)
    tr = translate(minimal(data, buffer__batch_size=4, buffer__total_epochs=3, algorithm__repeat_times=2))
    assert tr.native["trainer.total_steps"] == 3 * 40 // 4  # epochs x rows // batch_size
    tr = translate(minimal(data, buffer__batch_size=4, buffer__train_batch_size=16, algorithm__repeat_times=2))
    assert tr.native["trainer.total_steps"] == 10 * 8 // 16  # 10 explorer steps of 8 rows, 16 per trainer step
    tr = translate(minimal(data, buffer__batch_size=4, buffer__total_steps=7))
    assert tr.native["trainer.total_steps"] == 7
    tr = translate(minimal(data, buffer__batch_size=4, trainer__total_steps=2))
    assert tr.native["trainer.total_steps"] == 2
    remote = minimal(data)
    remote["buffer"]["explorer_input"]["taskset"]["path"] = "openai/gsm8k-not-here"
    with pytest.raises(ConfigError, match="buffer.total_steps"):
        translate(remote)


@pytest.mark.parametrize("name, why", [
    ("grpo_alfworld/alfworld.yaml", "explorer.env_vars"),
    ("tinker/tinker.yaml", "Tinker"),
    ("topr_gsm8k/gsm8k.yaml", "topr"),
    ("asymre_gsm8k/gsm8k.yaml", "asymre"),
    ("grpo_gsm8k_task_pipeline/gsm8k.yaml", "task_pipeline"),
])
def test_examples_we_cannot_run_are_refused_in_one_line_naming_why(env, name, why):
    with pytest.raises(ConfigError) as e:
        _translate_example(name, "cluster.gpu_per_node=0")
    assert why in str(e.value) and "\n" not in str(e.value)


def test_alfworld_is_refused_at_start_naming_what_it_needs(env, tmp_path, capsys):
    """Without its env_vars (refused above), the ALFWorld example stops before anything starts, naming the
    environment its workflow needs."""
    code = main(["run", str(EXAMPLES / "grpo_alfworld/alfworld.yaml"), "explorer.env_vars={}",
                 "cluster.gpu_per_node=0", f"checkpoint_root_dir={tmp_path}", "buffer.total_steps=2"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert "workflow 'alfworld_workflow' needs the alfworld package and the ALFWorld game files" in err[0]


def test_sft_and_dpo_examples_are_offline_runs_replaying_their_file(tmp_path, monkeypatch):
    sft = tmp_path / "sft.jsonl"
    sft.write_text("".join(json.dumps({"messages": [{"role": "user", "content": "1+1"},
                                                    {"role": "assistant", "content": "2"}]}) + "\n"
                           for _ in range(10)))
    tr = _translate_example("sft_mot/sft.yaml", f"buffer.trainer_input.experience_buffer.path={sft}",
                            "buffer.trainer_input.experience_buffer.subset_name=", "cluster.gpu_per_node=0",
                            "buffer.train_batch_size=4")
    n = tr.native
    assert n["mode"] == "offline" and n["buffer.replay_sources"] == [str(sft)]
    assert n["algorithm.policy_loss"] == "sft" and n["trainer.batch_size"] == 4
    assert n["trainer.total_steps"] == 10 // 4 and n["synchronizer.method"] == "checkpoint"
    assert n["buffer.replay_format.prompt_type"] == "messages" and n["buffer.replay_format.messages_key"] == "messages"
    assert "buffer.replay_subset_name" in n and n["buffer.replay_subset_name"] == ""
    cfg, _ = load_config_with_translation(EXAMPLES / "sft_mot/sft.yaml", [
        f"buffer.trainer_input.experience_buffer.path={sft}", "buffer.trainer_input.experience_buffer.subset_name=",
        "cluster.gpu_per_node=0", "buffer.train_batch_size=4", "model.model_path=runs/models/tiny"])
    assert cfg.mode == "offline" and cfg.buffer.replay_format.prompt_type == "messages"
    pairs = tmp_path / "dpo.jsonl"
    pairs.write_text("".join(json.dumps({"prompt": "p", "chosen": "a", "rejected": "b"}) + "\n" for _ in range(8)))
    monkeypatch.setenv("TRINITY_TASKSET_PATH", str(pairs))
    tr = _translate_example("dpo_humanlike/dpo.yaml", "cluster.gpu_per_node=0", "buffer.train_batch_size=2")
    n = tr.native
    assert n["mode"] == "offline" and n["algorithm.policy_loss"] == "dpo"
    assert n["explorer.repeat_times"] == 2 and n["trainer.batch_size"] == 4  # 2 pairs = 4 experiences
    assert n["trainer.total_steps"] == 2 * 8 // 2  # 2 epochs of 8 pairs, 2 a step (before trainer.total_steps 200)
    assert n["trainer.optimizer.lr_schedule"] == "cosine" and n["trainer.optimizer.beta2"] == 0.95
    assert (n["buffer.replay_format.prompt_type"], n["buffer.replay_format.chosen_key"]) == ("plaintext", "chosen")
    assert n["trainer.micro_batch_size"] == 4  # ppo_micro_batch_size_per_gpu 2, doubled for pairs as Trinity does


# ---------------------------------------------------------------- Trinity's defaults where ours differ


def _row(trinity_key: str):
    return next(d for d in DEFAULTS_WHERE_OURS_DIFFER if d.trinity == trinity_key)


@pytest.mark.parametrize("row", DEFAULTS_WHERE_OURS_DIFFER, ids=lambda d: d.trinity)
def test_each_trinity_default_where_ours_differs_is_applied(tmp_path, data, row):
    gpus = {"explorer.rollout_model.engine_type", "explorer.rollout_model.gpu_memory_utilization",
            "explorer.rollout_model.dtype", "synchronizer.sync_method"}
    tree = minimal(data, buffer__batch_size=2)
    if row.trinity in gpus:
        tree["cluster"] = {"node_num": 1, "gpu_per_node": 2}
    if row.trinity.startswith("eval_tasksets"):
        tree["buffer"]["explorer_input"]["eval_tasksets"] = [{"name": "e", "path": str(data)}]
    if row.trinity == "buffer.batch_size":
        del tree["buffer"]["batch_size"]
    n = translate(tree).native
    expected = {
        "algorithm.optimizer.lr": ("trainer.optimizer.lr", 1e-6),
        "algorithm.optimizer.weight_decay": ("trainer.optimizer.weight_decay", 0.01),
        "algorithm.optimizer.min_lr_ratio": ("trainer.optimizer.min_lr_ratio", 0.01),
        "buffer.batch_size": ("explorer.batch_size", 1),
        "algorithm.repeat_times": ("explorer.repeat_times", 1),
        "buffer.total_epochs": ("trainer.total_steps", 20 // 2),
        "mode": ("mode", "sync"),
        "synchronizer.sync_method": ("synchronizer.method", "broadcast"),
        "explorer.eval_interval": ("explorer.eval_interval", 0),  # no eval set here: checked below with one
        "explorer.max_timeout": ("explorer.task_timeout_s", 1800.0),
        "synchronizer.sync_timeout": ("synchronizer.sync_timeout_s", 3600.0),
        "buffer.trainer_input.experience_buffer.max_read_timeout": ("synchronizer.timeout_s", 1800.0),
        "trainer.max_checkpoints_to_keep": ("trainer.keep_checkpoints", 0),
        "trainer.use_dynamic_bsz / max_token_len_per_gpu": ("trainer.max_token_len_per_micro_batch", 2 * 256),
        "model.enable_prompt_truncation": ("explorer.filter_overlong_prompts", True),
        "explorer.rollout_model.engine_type": ("explorer.engine", "vllm"),
        "explorer.rollout_model.gpu_memory_utilization": ("explorer.vllm.gpu_memory_utilization", 0.9),
        "explorer.rollout_model.dtype": ("explorer.dtype", "bfloat16"),
        "eval_tasksets[].rollout_args.temperature": ("explorer.eval_tasksets", None),
    }
    ours, value = expected[row.trinity]
    assert ours == row.ours or row.ours.startswith(ours.split(".")[0])
    if row.trinity.startswith("eval_tasksets"):
        assert n["explorer.eval_tasksets"][0]["temperature"] == 1.0
        assert n["explorer.eval_interval"] == 100  # Trinity's default with an eval set
        return
    assert n[ours] == value, (row, n.get(ours))
    if row.trinity == "model.enable_prompt_truncation":
        assert n["explorer.max_prompt_tokens"] == 128  # max_model_len 256 split in halves, as Trinity


def test_trinitys_defaults_give_a_valid_config_of_ours(tmp_path, data, tiny_model_path):
    cfg_path = tmp_path / "t.yaml"
    tree = minimal(data, buffer__batch_size=2)
    tree["model"]["model_path"] = tiny_model_path
    tree["checkpoint_root_dir"] = str(tmp_path / "ckpt")
    cfg_path.write_text(yaml.safe_dump(tree))
    cfg = load_config(cfg_path)
    assert cfg.mode == "sync" and cfg.trainer.optimizer.lr == 1e-6 and cfg.explorer.batch_size == 2
    assert cfg.trainer.optimizer.weight_decay == 0.01 and cfg.trainer.keep_checkpoints == 0


# ---------------------------------------------------------------- modes


def test_both_mode_with_interval_or_offset_is_async_with_that_bound(data):
    n = translate(minimal(data, synchronizer__sync_interval=3)).native
    assert (n["mode"], n["synchronizer.max_staleness"], n["synchronizer.interval"]) == ("async", 2, 3)
    tree = minimal(data, synchronizer__sync_interval=8, explorer__eval_interval=50)
    tree["buffer"]["explorer_input"]["eval_tasksets"] = [{"name": "e", "path": str(data)}]
    assert translate(tree).native["explorer.eval_interval"] == 48  # Trinity: a multiple of sync_interval
    n = translate(minimal(data, synchronizer__sync_offset=1)).native
    assert (n["mode"], n["synchronizer.max_staleness"], n["synchronizer.offset"]) == ("async", 1, 1)
    tr = translate(minimal(data, synchronizer__sync_style="explorer_driven"))
    assert tr.native["mode"] == "async" and tr.native["synchronizer.style"] == "fixed"
    assert any("explorer_driven" in d for d in tr.differences)
    n = translate(minimal(data, synchronizer__sync_style="trainer_driven")).native
    assert n["synchronizer.style"] == "trainer_driven"


def test_explore_train_bench_serve_colocate_modes(data):
    tr = translate(minimal(data, mode="explore"))
    assert tr.role == "explorer" and tr.native["mode"] == "async"
    tr = translate(minimal(data, mode="train", buffer__train_batch_size=8))
    assert tr.role == "trainer" and tr.native["mode"] == "async"
    assert tr.native["explorer.batch_size"] == 8  # train_batch_size / repeat_times (1)
    assert translate(minimal(data, mode="bench")).command == "bench"
    assert translate(minimal(data, mode="serve")).command == "serve"
    tree = minimal(data, mode="colocate")
    tree["cluster"] = {"node_num": 1, "gpu_per_node": 1}
    n = translate(tree).native
    assert n["mode"] == "sync" and n["trainer.gpus_per_worker"] == 0.5 and n["explorer.gpus_per_engine"] == 0.5
    assert n["synchronizer.method"] == "ipc" and n["explorer.vllm.gpu_memory_utilization"] == 0.25
    with pytest.raises(ConfigError, match="Trinity's modes"):
        translate(minimal(data, mode="sideways"))


def test_not_enough_gpus_for_the_trainer_is_refused_as_trinity_refuses_it(data):
    tree = minimal(data)
    tree["cluster"] = {"node_num": 1, "gpu_per_node": 2}
    tree["explorer"] = {"rollout_model": {"engine_num": 2}}
    with pytest.raises(ConfigError, match="not enough GPUs for the trainer"):
        translate(tree)


def test_the_async_pair_translates_to_one_run_the_two_roles_share(env):
    overrides = ["cluster.gpu_per_node=0", "buffer.batch_size=4", "algorithm.repeat_times=4"]
    explorer_cfg, ex = load_config_with_translation(EXAMPLES / "async_gsm8k/explorer.yaml", overrides)
    trainer_cfg, tr = load_config_with_translation(EXAMPLES / "async_gsm8k/trainer.yaml",
                                                   ["cluster.gpu_per_node=0", "algorithm.repeat_times=4",
                                                    "buffer.train_batch_size=16"])
    assert (ex.role, tr.role) == ("explorer", "trainer")
    assert RunPaths.of(explorer_cfg).run_dir == RunPaths.of(trainer_cfg).run_dir
    assert explorer_cfg.mode == trainer_cfg.mode == "async"
    assert explorer_cfg.synchronizer.max_staleness == 9  # sync_interval 10 - 1
    assert config_differences(explorer_cfg, trainer_cfg) == []  # the roles' start-up check passes
    # with GPUs too: the explorer file's 4 engines and the trainer file's 4 workers agree on both sides
    a, _ = load_config_with_translation(EXAMPLES / "async_gsm8k/explorer.yaml", [])
    b, _ = load_config_with_translation(EXAMPLES / "async_gsm8k/trainer.yaml", [])
    assert config_differences(a, b) == [] and a.trainer.num_workers == 4 and a.explorer.num_engines == 4


def test_stages_of_sft_then_rft_are_our_warmup_and_others_are_refused(data, tmp_path):
    demos = tmp_path / "demos.jsonl"
    demos.write_text("".join(json.dumps({"messages": [{"role": "user", "content": "q"},
                                                      {"role": "assistant", "content": "a"}]}) + "\n"
                             for _ in range(12)))
    sft = {"stage_name": "sft_warmup", "mode": "train", "algorithm": {"algorithm_type": "sft"},
           "buffer": {"train_batch_size": 4, "total_steps": 3,
                      "trainer_input": {"experience_buffer": {"name": "d", "storage_type": "file",
                                                              "path": str(demos),
                                                              "format": {"prompt_type": "messages",
                                                                         "messages_key": "messages"}}}}}
    tr = translate(minimal(data, stages=[sft, {"stage_name": "rft"}]))
    n = tr.native
    assert (n["warmup.sft_steps"], n["warmup.batch_size"], n["warmup.demonstrations"]) == (3, 4, str(demos))
    assert n["warmup.num_demonstrations"] == 12 and n["warmup.lr"] == 1e-6
    with pytest.raises(ConfigError, match="the second stage sets algorithm"):
        translate(minimal(data, stages=[sft, {"stage_name": "rft", "algorithm": {"algorithm_type": "grpo"}}]))
    typo = {**sft, "buffer": {**sft["buffer"], "train_batch_sise": 4}}
    with pytest.raises(ConfigError, match=r"stages\.0\.buffer\.train_batch_sise are not Trinity-RFT's keys"):
        translate(minimal(data, stages=[typo, {"stage_name": "rft"}]))
    with pytest.raises(ConfigError, match="3 stage"):
        translate(minimal(data, stages=[sft, sft, {"stage_name": "rft"}]))


# ---------------------------------------------------------------- refusals, overrides, interpolation


def test_every_unknown_key_and_every_refused_value_in_one_message_with_a_spelling_hint(data):
    tree = minimal(data)
    tree["buffer"]["batch_sise"] = 4
    tree["explorer"] = {"rollout_model": {"engine_nums": 2, "ignore_eos": True}}
    tree["trainer"] = {"ulysses_sequence_parallel_size": 2}
    tree["nonsense"] = 1
    with pytest.raises(ConfigError) as e:
        translate(tree)
    msg = str(e.value)
    assert "\n" not in msg
    assert "3 key(s) are not Trinity-RFT's" in msg
    assert "buffer.batch_sise (did you mean buffer.batch_size?)" in msg
    assert "explorer.rollout_model.engine_nums (did you mean explorer.rollout_model.engine_num?)" in msg
    assert "nonsense" in msg
    assert "2 key(s) have no counterpart here" in msg and "ignore_eos" in msg and "sequence parallelism" in msg


def test_trainer_config_goes_through_verls_rules(data):
    tree = minimal(data)
    tree["trainer"] = {"trainer_config": {"actor_rollout_ref": {"actor": {"ppo_epochs": 2, "optim": {"lr": 0.5},
                                                                          "clip_ratio_high": 0.9,
                                                                          "ppo_micro_batch_size_per_gpu": 2},
                                                                "rollout": {"name": "sglang"}},
                                          "critic": {"optim": {"lr": 1e-5}, "cliprange_value": 0.3}}}
    tr = translate(tree)
    n = tr.native
    assert n["trainer.ppo_epochs"] == 2 and n["trainer.micro_batch_size"] == 2
    assert n["trainer.critic.lr"] == 1e-5 and n["trainer.critic.cliprange_value"] == 0.3
    assert n["trainer.optimizer.lr"] == 1e-6  # Trinity sets the actor's optimizer from algorithm.optimizer
    assert n.get("algorithm.clip_ratio_high") != 0.9  # Trinity's loss reads policy_loss_fn_args, not these
    assert any(k == "trainer.trainer_config.actor_rollout_ref.actor.optim.lr" for k, _, _ in tr.no_effect)
    tree["trainer"]["trainer_config"]["actor_rollout_ref"]["model"] = {"lora_rank": 0, "external_lib": "mylib"}
    with pytest.raises(ConfigError, match=r"trainer\.trainer_config\.actor_rollout_ref\.model\.external_lib"):
        translate(tree)


def test_overrides_in_trinitys_keys_apply_before_and_ours_after(data, tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(minimal(data, buffer__batch_size=2)))
    cfg, tr = load_config_with_translation(path, ["buffer.batch_size=4", "algorithm.repeat_times=2",
                                                  "synchronizer.sync_interval=2", "synchronizer.max_staleness=3",
                                                  "explorer.num_threads=2", "mode=explore"])
    assert cfg.explorer.batch_size == 4 and cfg.explorer.repeat_times == 2 and cfg.train_batch_size == 8
    assert cfg.synchronizer.interval == 2 and cfg.synchronizer.max_staleness == 3  # ours, after the translation
    assert tr.role == "explorer" and cfg.explorer.num_threads == 2
    cfg, _ = load_config_with_translation(path, ["mode=async", "buffer.explorer_input.taskset.split=train"])
    assert cfg.mode == "async"  # a mode only ours has: after the translation
    with pytest.raises(ConfigError, match="neither Trinity-RFT's config nor ours has the key 'buffer.batchsize'"):
        load_config_with_translation(path, ["buffer.batchsize=4"])


def test_oc_env_interpolations_resolve_as_omegaconf_does(data, tmp_path, monkeypatch):
    tree = minimal(data)
    tree["checkpoint_root_dir"] = "${oc.env:MY_ROOT,./ckpts}"
    tree["model"]["model_path"] = "${oc.env:MY_MODEL}"
    tree["cluster"]["node_num"] = "${oc.env:MY_NODES,1}"
    monkeypatch.delenv("MY_ROOT", raising=False)
    monkeypatch.delenv("MY_MODEL", raising=False)
    with pytest.raises(ConfigError, match="'model.model_path' reads the environment variable MY_MODEL, which is "
                                          "not set; set it or pass model.model_path=VALUE"):
        translate(tree)
    monkeypatch.setenv("MY_MODEL", "/models/m")
    n = translate(tree).native
    assert n["checkpoint_root_dir"] == "./ckpts" and n["model.path"] == "/models/m"
    monkeypatch.setenv("MY_ROOT", str(tmp_path))
    assert translate(tree).native["checkpoint_root_dir"] == str(tmp_path)
    assert translate(tree, overrides=["model.model_path=/other"]).native["model.path"] == "/other"


def test_group_puts_the_run_in_trinitys_job_folder(data, tmp_path):
    tree = minimal(data, checkpoint_root_dir=str(tmp_path), project="p", group="g", name="n")
    assert translate(tree).native["run_dir"] == str(tmp_path / "p" / "g" / "n")


# ---------------------------------------------------------------- the command line


def test_config_convert_and_run_take_trinitys_files_and_flags(env, capsys, tmp_path):
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    assert main(["config-convert", "-c", str(EXAMPLES / "ppo_countdown_exp_replay/countdown.yaml"),
                 f"buffer.explorer_input.taskset.path={env}", "cluster.gpu_per_node=0",
                 "--plugin-dir", str(plugins)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    differences = [ln for ln in lines if ln.startswith("# difference: ")]
    assert len(differences) >= 3 and lines[-len(differences):] == differences  # it ends with them
    assert any("explorer_driven" in d for d in differences) and any("replay_buffer" in d for d in differences)
    assert any("no GPU" in d for d in differences)
    cfg = yaml.safe_load("\n".join(ln for ln in lines if not ln.startswith("#")))
    assert cfg["mode"] == "async" and cfg["buffer"]["read_policy"] == "replay"
    assert cfg["explorer"]["plugin_dirs"] == [str(plugins)]
    assert cfg["explorer"]["taskset"]["reward_fn"] == "countdown_reward"
    for argv in (["run", "--config", str(EXAMPLES / "grpo_gsm8k/gsm8k.yaml")],
                 ["run", str(EXAMPLES / "grpo_gsm8k/gsm8k.yaml")]):
        assert main([*argv, "cluster.gpu_per_node=0", "--print-config"]) == 0
        out = capsys.readouterr().out
        assert out.startswith("Trinity config: mode sync")
        assert yaml.safe_load(out.split("\n", 1)[1])["explorer"]["workflow"] == "math_workflow"


def test_config_convert_of_a_config_of_ours_says_so(capsys):
    assert main(["config-convert", str(ROOT / "configs/quickstart.yaml")]) == 2
    assert "not a verl-shaped config (no data" in capsys.readouterr().err


def test_the_translation_is_kept_in_the_run_directory(env, tmp_path):
    from trinity_like.cli import _keep_translation

    cfg, tr = load_config_with_translation(EXAMPLES / "grpo_gsm8k/gsm8k.yaml", ["cluster.gpu_per_node=0"])
    _keep_translation(tr, cfg)
    report = yaml.safe_load((RunPaths.of(cfg).run_dir / "trinity_translation.yaml").read_text())
    assert report["role"] == "all" and report["differences"] and any(
        r["trinity"] == "algorithm.optimizer.lr" for r in report["applied"])


def test_a_file_named_in_the_config_is_found_beside_it(tmp_path):
    data = gsm8k_rows(tmp_path / "tasks.jsonl")
    cfg_path = tmp_path / "conf" / "t.yaml"
    cfg_path.parent.mkdir()
    tree = minimal(data)
    tree["buffer"]["explorer_input"]["taskset"]["path"] = "../tasks.jsonl"
    cfg_path.write_text(textwrap.dedent(yaml.safe_dump(tree)))
    tr = translate(load_trinity_file(cfg_path), cfg_path)
    assert Path(tr.native["explorer.taskset.path"]).resolve() == data.resolve()


def test_run_of_a_bench_config_is_our_bench(env, capsys, monkeypatch):
    """Trinity's `mode: bench` file under `run` is `trinity-like bench`: here it reaches the external engine, which
    names the environment variable it lacks (run itself refuses engine external before anything starts)."""
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    assert main(["run", str(EXAMPLES / "bench/external_model.yaml")]) == 2
    captured = capsys.readouterr()
    assert "Trinity config: mode bench: `trinity-like bench` on this config" in captured.out
    assert "environment variable OPENAI_BASE_URL, which is not set" in captured.err


def test_lora_is_one_adapter_trained_with_ddp(data):
    tree = minimal(data, trainer__trainer_strategy="fsdp")
    tree["model"]["lora_configs"] = [{"lora_rank": 16, "lora_alpha": 32, "target_modules": "all-linear"}]
    tr = translate(tree)
    n = tr.native
    assert (n["trainer.lora.enabled"], n["trainer.lora.r"], n["trainer.lora.alpha"]) == (True, 16, 32)
    assert "down_proj" in n["trainer.lora.target_modules"] and n["trainer.strategy"] == "ddp"
    assert n["synchronizer.method"] == "checkpoint"  # Trinity's LoRA syncs by checkpoint
    tree["model"]["lora_configs"].append({"lora_rank": 8})
    with pytest.raises(ConfigError, match="more than one adapter"):
        translate(tree)


def test_trinity_bench_mode_benches_every_checkpoint_of_the_run_or_the_latest(data, tmp_path):
    """Trinity's mode bench evaluates each checkpoint of the run (our `bench --all-checkpoints`), the latest one with
    explorer.bench_on_latest_checkpoint, and the model itself while the run has none."""
    from trinity_like.cli import _bench_every_checkpoint
    from trinity_like.runtime.checkpoints import TRAINER_STATE

    tree = minimal(data, mode="bench", checkpoint_root_dir=str(tmp_path / "ckpt"))
    path = tmp_path / "bench.yaml"
    path.write_text(yaml.safe_dump(tree))
    cfg, tr = load_config_with_translation(path)
    assert tr.command == "bench" and not cfg.explorer.bench_on_latest_checkpoint
    assert not _bench_every_checkpoint(cfg)  # no checkpoint yet: the model itself
    ckpt = RunPaths.of(cfg).checkpoint_dir
    (ckpt / "step_2").mkdir(parents=True)
    (ckpt / "step_2" / TRAINER_STATE).write_text("{}")
    (ckpt / "latest").write_text("2")
    assert _bench_every_checkpoint(cfg)
    tree["explorer"] = {"bench_on_latest_checkpoint": True}
    path.write_text(yaml.safe_dump(tree))
    cfg, _ = load_config_with_translation(path)
    assert cfg.explorer.bench_on_latest_checkpoint and not _bench_every_checkpoint(cfg)
