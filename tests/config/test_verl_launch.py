"""verl users as they really come (issue 36, items 1-5): verl's launch command lines (its example scripts'
override lists, tests/config/verl_scripts/), its composed defaults and interpolations, its GPUs, and its meaning
(on-policy sync, recomputed old log-probs, checkpoints kept) by default."""

from __future__ import annotations

import pytest
import yaml
from conftest import VERL_SCRIPTS, read_verl_script, verl_script_on_the_tiny_model
from conftest import write_verl_data as verl_data

from trinity_like.cli import main
from trinity_like.common.errors import ConfigError
from trinity_like.config import load_config
from trinity_like.config.loading import load_config_with_translation
from trinity_like.config.verl import View, gpu_split, translate
from trinity_like.config.verl_compose import (
    apply_overrides,
    compose,
    default_leaves,
    default_tree,
    parse_value,
)
from trinity_like.runtime.paths import RunPaths

SCRIPTS = sorted(p.stem for p in VERL_SCRIPTS.glob("*.txt"))


# ---------------------------------------------------------------- Hydra's override grammar


@pytest.mark.parametrize("raw,value", [
    ("1e-6", 1e-6), ("3e-6", 3e-6), ("0", 0), ("-1", -1), ("0.28", 0.28), ("True", True), ("False", False),
    ("null", None), ("vllm", "vllm"), ("'left'", "left"), ('"x y"', "x y"), ("$HOME/data/train.parquet",
                                                                          "$HOME/data/train.parquet"),
    ('["console","wandb"]', ["console", "wandb"]), ("[console,wandb]", ["console", "wandb"]),
    ("['$HOME/a.parquet', '$HOME/b.parquet']", ["$HOME/a.parquet", "$HOME/b.parquet"]), ("[1e-6, 2]", [1e-6, 2]),
    ("${data.max_response_length}", "${data.max_response_length}"), ("all-linear", "all-linear"),
])
def test_override_values_read_as_hydra_reads_them(raw, value):
    assert parse_value(raw) == value and type(parse_value(raw)) is type(value)


def test_overrides_set_add_and_delete_as_hydra_does():
    tree = {"data": {"train_batch_size": 1024, "tokenizer": None}, "trainer": {"logger": ["console"]}}
    out = apply_overrides(tree, ["data.train_batch_size=4", "+data.new.key=3", "++trainer.extra=x",
                                 "trainer.logger=[console,wandb]", "~data.tokenizer"])
    assert out == {"data": {"train_batch_size": 4, "new": {"key": 3}},
                   "trainer": {"logger": ["console", "wandb"], "extra": "x"}}
    assert tree["data"]["train_batch_size"] == 1024  # a copy
    with pytest.raises(ConfigError, match=r"no key 'data\.train_batch_sise'.*\+data\.train_batch_sise="):
        apply_overrides(tree, ["data.train_batch_sise=4"])
    with pytest.raises(ConfigError, match="no key 'data.nothing' to delete"):
        apply_overrides(tree, ["~data.nothing"])
    # the last of two overrides of one key wins (verl's ppo_qwen2_5_32b script sets one twice)
    assert apply_overrides(tree, ["data.train_batch_size=4", "data.train_batch_size=8"])["data"]["train_batch_size"] == 8


# ---------------------------------------------------------------- composed defaults and interpolations


def test_interpolations_resolve_after_the_overrides():
    leaves = default_leaves()
    assert leaves["actor_rollout_ref.rollout.response_length"] == 512  # ${oc.select:data.max_response_length,512}
    tree = compose(None, ["data.max_response_length=1024", "actor_rollout_ref.model.path=/m"])
    assert tree["actor_rollout_ref"]["rollout"]["response_length"] == 1024
    assert tree["trainer"]["default_local_dir"] == "checkpoints/verl_examples/gsm8k"
    assert tree["actor_rollout_ref"]["rollout"]["prometheus"]["served_model_name"] == "/m"


def test_oc_env_and_a_broken_interpolation(monkeypatch):
    monkeypatch.setenv("VERL_TEST_BATCH", "7")
    tree = compose({"data": {"train_batch_size": "${oc.env:VERL_TEST_BATCH}"}})
    assert tree["data"]["train_batch_size"] == "7"  # oc.env gives text, as in verl
    with pytest.raises(ConfigError, match="interpolation.*cannot be resolved"):
        compose({"data": {"train_batch_size": "${data.no_such_key}"}})


MINIMAL = {"data": {"train_batch_size": 4, "max_response_length": 16},
           "algorithm": {"adv_estimator": "grpo"},
           "actor_rollout_ref": {"actor": {"ppo_mini_batch_size": 2, "optim": {"lr": 1e-5}},
                                 "rollout": {"name": "hf", "n": 2}},
           "trainer": {"total_training_steps": 3, "device": "cpu", "n_gpus_per_node": 1}}


def test_a_minimal_file_its_composed_form_and_its_defaults_list_form_translate_the_same(tmp_path, tiny_model_path):
    train = verl_data(tmp_path / "train.parquet")
    minimal = yaml.safe_load(yaml.safe_dump(MINIMAL))
    minimal["data"]["train_files"] = str(train)
    minimal["actor_rollout_ref"]["model"] = {"path": str(tiny_model_path)}
    # verl's whole config written out (what `python -m verl.trainer.main_ppo --cfg job` prints), interpolations
    # resolved; and the file as a Hydra primary config: defaults list first, then its own keys
    composed = compose(minimal)
    as_primary = {"defaults": ["ppo_trainer", "_self_"], **minimal}
    native = translate(minimal, tmp_path / "v.yaml").native
    assert translate(composed, tmp_path / "v.yaml").native == native
    assert translate(as_primary, tmp_path / "v.yaml").native == native
    # and verl's own ppo_trainer.yaml defaults list (groups at verl's own choices) is accepted as it is
    verl_list = {"defaults": [{"actor@actor_rollout_ref.actor": "dp_actor"}, "reward_manager@reward_manager",
                              {"rollout@actor_rollout_ref.rollout": "rollout"}, "_self_"], **minimal}
    assert translate(verl_list, tmp_path / "v.yaml").native == native
    # what verl means by it, and not our defaults: a key the file omits is verl's
    assert native["explorer.vllm.max_num_seqs"] == default_leaves()["actor_rollout_ref.rollout.max_num_seqs"]
    assert native["trainer.gradient_checkpointing"] is True  # verl's enable_gradient_checkpointing default
    assert native["mode"] == "sync" and native["algorithm.off_policy.recompute_old_log_probs"] is True
    assert native["trainer.keep_checkpoints"] == 0  # verl's max_actor_ckpt_to_keep: null keeps all


def test_a_defaults_list_naming_another_group_is_refused(tmp_path):
    tree = {"defaults": [{"actor@actor_rollout_ref.actor": "megatron_actor"}, "_self_"], **MINIMAL}
    with pytest.raises(ConfigError, match="actor@actor_rollout_ref.actor: megatron_actor.*merge that group"):
        translate(tree, tmp_path / "v.yaml")


def test_keys_that_follow_an_interpolation_are_not_the_users_choice(tmp_path, tiny_model_path):
    """verl's `actor.rollout_n` is `${actor_rollout_ref.rollout.n}`: a script that sets rollout.n changes it, but
    did not set it; only keys the user wrote are refused when they have no counterpart."""
    train = verl_data(tmp_path / "train.parquet")
    tr = translate(None, None, overrides=[f"data.train_files={train}", f"actor_rollout_ref.model.path={tiny_model_path}",
                                          "actor_rollout_ref.rollout.n=5", "trainer.total_training_steps=1"])
    assert not tr.unmapped
    assert "actor_rollout_ref.actor.rollout_n" in {k for k, _, _ in tr.at_default}
    with pytest.raises(ConfigError, match=r"1 key\(s\) have no counterpart here: actor_rollout_ref.actor.rollout_n"):
        translate(None, None, overrides=[f"data.train_files={train}", "actor_rollout_ref.actor.rollout_n=5",
                                         "trainer.total_training_steps=1"])


# ---------------------------------------------------------------- the example scripts' command lines


EXPECTED = {
    # script: (keys refused without --allow-unmapped, what the refusal's message says to use instead)
    "grpo_qwen2_7b_gsm8k": (set(), []),
    "grpo_qwen2_5_3b_gsm8k_lora": (set(), []),  # TP 2 on 2 GPUs lowered to 1 (said in the split)
    "grpo_qwen2_7b_math": (set(), []),  # gsm8k + MATH: two training files, explorer.taskset.files
    "grpo_qwen2_7b_seq_balance": ({"actor_rollout_ref.rollout.name"}, ["actor_rollout_ref.rollout.name=vllm"]),
    "grpo_qwen3_8b_npu": (set(), []),
    "ppo_deepseek7b_gsm8k": (set(), []),
    "ppo_qwen2_7b_seq_balance": (set(), []),
    "ppo_qwen2_5_32b": (set(), []),
    "dapo_qwen2_5_32b": ({"actor_rollout_ref.actor.ulysses_sequence_parallel_size"}, []),
    "dapo_qwen2_5_7b_math_main_ppo": ({"actor_rollout_ref.actor.ulysses_sequence_parallel_size",
                                       "actor_rollout_ref.model.override_config.max_position_embeddings"}, []),
}


def test_every_script_in_the_data_is_expected():
    assert set(EXPECTED) == set(SCRIPTS) and len(SCRIPTS) >= 6


@pytest.mark.parametrize("name", SCRIPTS)
def test_each_example_scripts_command_line_converts_with_its_gpus_and_verls_meaning(name, tmp_path, tiny_model_path,
                                                                                      capsys):
    """The script's overrides as verl gets them (data and model paths replaced, nothing else): `config-convert
    --verl` prints the config of ours, the mode and the GPU split (nodes x GPUs per node, engines of the
    tensor-parallel size); keys with no counterpart are named in one message, and --allow-unmapped (or the
    replacement the message names) converts."""
    entry, overrides = read_verl_script(name)
    train = verl_data(tmp_path / "train.parquet", n=8)
    # a list of training files (gsm8k + MATH) stays a list: two real files, whose ids collide as verl's do
    trains = [str(verl_data(tmp_path / d / "train.parquet", n=8 + i)) for i, d in enumerate(("gsm8k", "math"))]
    given = next(o.partition("=")[2] for o in overrides if o.startswith("data.train_files="))
    listed = given.startswith("[")
    paths = {"data.train_files": f"[{','.join(trains)}]" if listed else str(train), "data.val_files": str(train),
             "actor_rollout_ref.model.path": str(tiny_model_path), "critic.model.path": str(tiny_model_path)}
    items = [f"{item.partition('=')[0]}={paths[item.partition('=')[0]]}" if item.partition("=")[0] in paths
             else item for item in overrides]
    ignored, instead = EXPECTED[name]
    argv = ["config-convert", "--verl", entry, *items]
    if ignored:
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.count("error: ") == 1 and all(k in err for k in ignored) and "--allow-unmapped" in err
        assert all(fix in err for fix in instead)
        argv += instead or ["--allow-unmapped"]
    assert main(argv) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    native = yaml.safe_load(out)
    assert native["mode"] == "sync" and native["algorithm"]["off_policy"]["recompute_old_log_probs"] is True
    verl = compose(None, [a for a in argv[3:] if a != "--allow-unmapped"], entry)
    total = verl["trainer"]["nnodes"] * verl["trainer"]["n_gpus_per_node"]
    tp = verl["actor_rollout_ref"]["rollout"]["tensor_model_parallel_size"]
    workers, engines = native["trainer"]["num_workers"], native["explorer"]["num_engines"]
    engine_gpus = native["explorer"]["gpus_per_engine"]
    assert workers * native["trainer"]["gpus_per_worker"] + engines * engine_gpus == total  # every GPU, once
    assert engine_gpus == tp or (engine_gpus < tp and f"tensor_model_parallel_size {tp} lowered" in out)
    assert workers >= engines * engine_gpus - 1  # about half to the trainer
    assert native["explorer"]["engine"] == "vllm"
    assert "# mode sync, as verl's PPO" in out and "mode=async" in out and f"GPUs: {total} (" in out
    assert {line.split(" = ")[0].removeprefix("# ignored: ") for line in out.splitlines()
            if line.startswith("# ignored: ")} == (set() if instead else ignored)
    n = verl["actor_rollout_ref"]["rollout"]["n"]
    assert native["explorer"]["repeat_times"] == n
    assert native["explorer"]["batch_size"] == verl["data"].get("gen_batch_size", verl["data"]["train_batch_size"])
    taskset = native["explorer"]["taskset"]
    assert (taskset.get("files"), taskset.get("path")) == ((trains, None) if listed else (None, str(train)))


def test_two_training_files_are_the_task_set_files_and_count_both_in_the_steps(tmp_path, tiny_model_path):
    """verl concatenates several data.train_files (three of the scripts give gsm8k and MATH): here they become
    explorer.taskset.files, concatenated into the run's tasks.parquet, and the run's length (total_epochs x rows //
    train_batch_size) counts the rows of both."""
    gsm8k = verl_data(tmp_path / "gsm8k" / "train.parquet", n=10, data_source="openai/gsm8k")
    math = verl_data(tmp_path / "math" / "train.parquet", n=7, data_source="DigitalLearningGmbH/MATH-lighteval")
    cfg, tr = load_config_with_translation(None, [f"data.train_files=[{gsm8k},{math}]", "trainer.total_epochs=3",
                                                  "data.train_batch_size=4",
                                                  f"actor_rollout_ref.model.path={tiny_model_path}"], verl=True)
    assert cfg.explorer.taskset.files == [str(gsm8k), str(math)] and cfg.explorer.taskset.path == ""
    assert cfg.trainer.total_steps == 3 * (17 // 4)  # verl drops the last partial batch of the concatenation
    assert any("3 x 17 rows of 2 files // data.train_batch_size" in how for _, _, how in tr.applied)
    one, _ = load_config_with_translation(None, [f"data.train_files=[{gsm8k}]", "trainer.total_epochs=3",
                                                 "data.train_batch_size=4",
                                                 f"actor_rollout_ref.model.path={tiny_model_path}"], verl=True)
    assert (one.explorer.taskset.path, one.explorer.taskset.files, one.trainer.total_steps) == (str(gsm8k), [], 6)
    with pytest.raises(ConfigError, match="names no readable file"):
        load_config_with_translation(None, [f"data.train_files=[{gsm8k},{tmp_path / 'missing.parquet'}]",
                                            f"actor_rollout_ref.model.path={tiny_model_path}"], verl=True)


def test_a_verl_file_takes_verl_overrides_and_ours_after_it(tmp_path, tiny_model_path):
    """`trinity-like run verl.yaml data.train_batch_size=4 mode=async`: a key verl's config has is verl's
    (applied before translation, reaching the keys that interpolate it), a key only ours has is ours."""
    train = verl_data(tmp_path / "train.parquet")
    tree = yaml.safe_load(yaml.safe_dump(MINIMAL))
    tree["data"]["train_files"] = str(train)
    tree["actor_rollout_ref"]["model"] = {"path": str(tiny_model_path)}
    path = tmp_path / "verl.yaml"
    path.write_text(yaml.safe_dump(tree))
    cfg = load_config(path, ["data.train_batch_size=3", "data.max_response_length=6", "mode=async",
                             "synchronizer.max_staleness=2"])
    assert cfg.explorer.batch_size == 3 and cfg.explorer.sampling.max_new_tokens == 6
    assert cfg.mode == "async" and cfg.synchronizer.max_staleness == 2
    assert cfg.algorithm.off_policy.recompute_old_log_probs is True  # still verl's, unless turned off too
    with pytest.raises(ConfigError, match="neither verl's config nor ours has the key 'data.train_batch_sise'"):
        load_config(path, ["data.train_batch_sise=3"])


def test_config_convert_says_what_async_would_change(tmp_path, tiny_model_path, capsys):
    train = verl_data(tmp_path / "train.parquet")
    items = [f"data.train_files={train}", f"actor_rollout_ref.model.path={tiny_model_path}",
             "trainer.total_training_steps=2", "trainer.n_gpus_per_node=4"]
    assert main(["config-convert", "--verl", *items]) == 0
    sync_out = capsys.readouterr().out
    assert "mode sync" in sync_out and "mode=async lets the explorer generate while the trainer trains" in sync_out
    assert "GPUs: 4 (trainer 2 worker(s) x 1 GPU, 1 engine(s) x 2 GPU (tensor parallel 2)" in sync_out
    assert main(["config-convert", "--verl", *items, "mode=async"]) == 0
    async_out = capsys.readouterr().out
    assert "mode async (verl's PPO is sync), synchronizer.max_staleness=1, old log-probs recomputed" in async_out


# ---------------------------------------------------------------- GPUs, run directory, generation batch


def _split(gpus, tp=1, nodes=1, reward_model=False, device="cuda"):
    leaves = {"trainer.n_gpus_per_node": gpus, "trainer.nnodes": nodes, "trainer.device": device,
              "actor_rollout_ref.rollout.tensor_model_parallel_size": tp, "reward_model.enable": reward_model}
    s = gpu_split(View(leaves, None, default_leaves()))
    return s.workers, s.worker_gpus, s.engines, s.engine_gpus, s.reward_gpus


@pytest.mark.parametrize("gpus,tp,nodes,rm,split", [
    # (workers, GPUs each, engines, GPUs each, reward model's GPUs)
    (1, 1, 1, False, (1, 0.5, 1, 0.5, 0.0)),
    (2, 1, 1, False, (1, 1.0, 1, 1.0, 0.0)),
    (8, 1, 1, False, (4, 1.0, 4, 1.0, 0.0)),
    (8, 2, 1, False, (4, 1.0, 2, 2.0, 0.0)),
    (8, 4, 1, False, (4, 1.0, 1, 4.0, 0.0)),
    (8, 8, 1, False, (4, 1.0, 1, 4.0, 0.0)),  # TP 8 of 8 GPUs would leave the trainer none: lowered to 4
    (8, 4, 16, False, (64, 1.0, 16, 4.0, 0.0)),  # nodes x GPUs per node for the whole job
    (6, 4, 1, False, (4, 1.0, 1, 2.0, 0.0)),  # an engine of 4 of 6 GPUs: lowered to 2
    (8, 2, 1, True, (3, 1.0, 2, 2.0, 1.0)),
    (8, 1, 1, False, (4, 1.0, 4, 1.0, 0.0)),
])
def test_gpus_as_verl_means_them(gpus, tp, nodes, rm, split):
    got = _split(gpus, tp, nodes, rm)
    assert got == split
    assert got[0] * got[1] + got[2] * got[3] + got[4] == gpus * nodes  # every GPU used, none twice
    assert _split(8, 2, device="cpu") == (1, 0.0, 1, 0.0, 0.0)


def test_default_local_dir_any_folder_is_the_run_directory(tmp_path, tiny_model_path):
    train = verl_data(tmp_path / "train.parquet")
    base = [f"data.train_files={train}", f"actor_rollout_ref.model.path={tiny_model_path}",
            "trainer.total_training_steps=1", "trainer.device=cpu"]
    cfg, _ = load_config_with_translation(None, [*base, f"trainer.default_local_dir={tmp_path}/my/ckpts"], verl=True)
    assert RunPaths.of(cfg).run_dir == tmp_path / "my" / "ckpts"
    # verl's own layout keeps ours: <root>/<project>/<experiment>
    cfg, _ = load_config_with_translation(None, [*base, "trainer.project_name=p", "trainer.experiment_name=e",
                                                 f"trainer.default_local_dir={tmp_path}/ck/p/e"], verl=True)
    assert (cfg.checkpoint_root_dir, cfg.run_dir, RunPaths.of(cfg).run_dir) == (str(tmp_path / "ck"), "",
                                                                                tmp_path / "ck" / "p" / "e")


def test_dapos_generation_batch(tmp_path, tiny_model_path):
    train = verl_data(tmp_path / "train.parquet")
    items = [f"data.train_files={train}", f"actor_rollout_ref.model.path={tiny_model_path}", "trainer.device=cpu",
             "trainer.total_training_steps=1", "data.train_batch_size=2", "data.gen_batch_size=6",
             "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.actor.ppo_mini_batch_size=2"]
    cfg, tr = load_config_with_translation(None, items, verl=True, entry="recipe.dapo.main_dapo")
    assert cfg.explorer.batch_size == 6 and cfg.trainer.batch_size == 8  # 6 prompts generated, 2 x 4 trained
    assert cfg.explorer.dynamic_sampling is False  # DAPO's config leaves filter_groups off until a script turns it on
    assert cfg.reward.manager == "dapo"  # dapo_trainer.yaml's reward manager
    assert default_tree("recipe.dapo.main_dapo")["data"]["gen_batch_size"] == "${data.train_batch_size}"


@pytest.mark.parametrize("item,says", [
    ("actor_rollout_ref.actor.ulysses_sequence_parallel_size=4", "gradient checkpointing"),
    ("actor_rollout_ref.rollout.name=sglang", "rollout.name=vllm"),
])
def test_keys_without_a_counterpart_say_what_to_use_instead(item, says, tmp_path, tiny_model_path):
    train = verl_data(tmp_path / "train.parquet")
    with pytest.raises(ConfigError, match=says):
        load_config_with_translation(None, [f"data.train_files={train}", "trainer.total_training_steps=1",
                                            f"actor_rollout_ref.model.path={tiny_model_path}", item], verl=True)


def test_the_tiny_model_variant_of_a_script_replaces_only_paths_and_sizes(tmp_path, tiny_model_path):
    """The e2e replays (tests/e2e/test_verl_scripts.py) keep every override of the script but data, model and
    run-directory paths, then add the tiny model's sizes after them."""
    entry, original = read_verl_script("grpo_qwen2_7b_gsm8k")
    _, items = verl_script_on_the_tiny_model("grpo_qwen2_7b_gsm8k", tmp_path, tiny_model_path, "t.parquet", "v.parquet")
    kept = [o for o in original if o.partition("=")[0] not in ("data.train_files", "data.val_files",
                                                              "actor_rollout_ref.model.path")]
    assert items[:len(original)] == [o if o in kept else items[i] for i, o in enumerate(original)]
    assert entry == "verl.trainer.main_ppo"


def test_the_docs_example_is_what_the_script_converts_to(tmp_path, tiny_model_path, capsys):
    """docs/verl.md shows what `config-convert --verl` says of verl's run_qwen2-7b.sh: that is what it says (the
    gsm8k training file of 7,473 rows, as verl's preprocessing writes it)."""
    from trinity_like.config.verl import DOCS_PATH, EXAMPLE_SUMMARY

    entry, overrides = read_verl_script("grpo_qwen2_7b_gsm8k")
    train = verl_data(tmp_path / "train.parquet", n=7473, data_source="openai/gsm8k")
    items = [f"data.train_files={train}" if o.startswith("data.train_files=") else
             f"data.val_files={train}" if o.startswith("data.val_files=") else o for o in overrides]
    assert main(["config-convert", "--verl", entry, *items]) == 0
    out = capsys.readouterr().out
    assert EXAMPLE_SUMMARY in out.splitlines() and EXAMPLE_SUMMARY in DOCS_PATH.read_text()
    native = yaml.safe_load(out)
    assert (native["explorer"]["batch_size"], native["explorer"]["repeat_times"]) == (1024, 5)
    assert (native["trainer"]["mini_batch_size"], native["trainer"]["total_steps"]) == (1280, 105)
    assert native["explorer"]["vllm"] == {"enforce_eager": False, "max_num_seqs": 256, "gpu_memory_utilization": 0.6}
    assert native["trainer"]["keep_checkpoints"] == 0 and native["explorer"]["engine"] == "vllm"
    assert len(overrides) == 37


def test_a_file_with_its_own_interpolations_and_a_defaults_list_means_its_hand_merged_form(tmp_path, tiny_model_path,
                                                                                            monkeypatch):
    """The file's own `${...}` (a key, `oc.select`, `oc.env`) resolve as verl resolves them, after the overrides."""
    train = verl_data(tmp_path / "train.parquet")
    monkeypatch.setenv("VERL_TEST_ROOT", str(tmp_path / "ckpts"))
    text = f"""\
defaults:
  - ppo_trainer
  - _self_
data: {{train_files: {train}, train_batch_size: 4, max_response_length: 12}}
actor_rollout_ref:
  model: {{path: {tiny_model_path}}}
  actor: {{ppo_mini_batch_size: 2}}
  rollout: {{name: hf, n: 2, response_length: "${{data.max_response_length}}",
            temperature: "${{oc.select:algorithm.no_such_key,0.7}}"}}
trainer: {{total_training_steps: 2, device: cpu, n_gpus_per_node: 1,
          default_local_dir: "${{oc.env:VERL_TEST_ROOT}}/${{trainer.project_name}}/${{trainer.experiment_name}}"}}
"""
    path = tmp_path / "verl.yaml"
    path.write_text(text)
    merged = {"data": {"train_files": str(train), "train_batch_size": 4, "max_response_length": 12},
              "actor_rollout_ref": {"model": {"path": str(tiny_model_path)}, "actor": {"ppo_mini_batch_size": 2},
                                    "rollout": {"name": "hf", "n": 2, "response_length": 12, "temperature": 0.7}},
              "trainer": {"total_training_steps": 2, "device": "cpu", "n_gpus_per_node": 1,
                          "default_local_dir": f"{tmp_path}/ckpts/verl_examples/gsm8k"}}
    cfg, tr = load_config_with_translation(path)
    assert tr.native == translate(merged, tmp_path / "m.yaml").native
    assert cfg.explorer.sampling.max_new_tokens == 12 and cfg.explorer.sampling.temperature == 0.7
    assert cfg.checkpoint_root_dir == str(tmp_path / "ckpts")
    # an override reaches the file's interpolation too
    cfg, _ = load_config_with_translation(path, ["data.max_response_length=20"])
    assert cfg.explorer.sampling.max_new_tokens == 20
