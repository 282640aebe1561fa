"""verl-shaped configs (trinity_like/config/verl.py), verl's data files as task sets, and verl's reward function
signatures: the schema of seed 003 in full, its GRPO config, the backends it lists, and the refusals."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from conftest import write_verl_data as verl_data  # tests/ is on sys.path

from trinity_like.algorithms.rewards import (
    NaiveRewardManager,
    as_batched_reward_fn,
    load_reward_function,
    load_reward_manager,
)
from trinity_like.cli import main
from trinity_like.common.errors import ConfigError
from trinity_like.common.tasks import load_taskset, prompt_ids
from trinity_like.config import load_config
from trinity_like.config.verl import DOCS_PATH, render_docs, translate
from trinity_like.config.verl_compose import default_leaves


def write(tmp_path, text, name="verl.yaml"):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


# The PPO configuration of seed 003 (verl/trainer/config/ppo_trainer.yaml as the seed gives it), files made real.
SEED_PPO = """\
data:
  train_files: {train}
  val_files: {val}
  train_batch_size: 256
  max_prompt_length: 512
  max_response_length: 2048
algorithm:
  adv_estimator: gae
  gamma: 0.99
  lam: 0.95
  use_kl_in_reward: false
actor_rollout_ref:
  model:
    path: {model}
    backend: fsdp
  actor:
    ppo_mini_batch_size: 64
    ppo_epochs: 1
    clip_ratio: 0.2
    use_kl_loss: true
    kl_loss_coef: 0.001
    kl_loss_type: low_var
    loss_agg_mode: token-mean
    gradient_checkpointing: true
    max_grad_norm: 1.0
    lr: 1e-6
  rollout:
    name: vllm
    n: 8
    temperature: 0.7
    top_p: 0.95
    log_prob_micro_batch_size: 8
critic:
  model:
    path: {model}
  ppo_mini_batch_size: 64
  ppo_epochs: 1
trainer:
  total_epochs: 3
  n_gpus_per_node: 8
  nnodes: 1
  save_freq: 100
  experiment_name: my_experiment
  async_weight_update: false
"""


@pytest.fixture
def data_files(tmp_path):
    return verl_data(tmp_path / "train.parquet", n=600), verl_data(tmp_path / "val.parquet", n=8, split="test")


def test_seed_ppo_config_translates_key_by_key(tmp_path, data_files, tiny_model_path):
    train, val = data_files
    path = write(tmp_path, SEED_PPO.format(train=train, val=val, model=tiny_model_path))
    cfg = load_config(path)
    assert cfg.explorer.taskset.path == str(train)
    assert [(e.name, e.path, e.k, e.temperature) for e in cfg.explorer.eval_tasksets] == [("val", str(val), 1, 0.0)]
    assert cfg.explorer.batch_size == 256 and cfg.explorer.repeat_times == 8
    assert cfg.explorer.sampling.max_new_tokens == 2048 and cfg.reward.max_resp_len == 2048
    assert (cfg.algorithm.adv_estimator, cfg.algorithm.gamma, cfg.algorithm.lam) == ("gae", 0.99, 0.95)
    assert cfg.model.path == str(tiny_model_path)
    assert cfg.trainer.strategy == "fsdp2"
    assert cfg.trainer.mini_batch_size == 64 * 8  # verl counts prompts, we count experiences
    assert cfg.algorithm.clip_ratio_low == cfg.algorithm.clip_ratio_high == 0.2
    assert cfg.algorithm.use_kl_loss and cfg.algorithm.kl_loss_type == "low_var_kl"
    assert cfg.trainer.gradient_checkpointing and cfg.trainer.optimizer.max_grad_norm == 1.0
    assert cfg.trainer.optimizer.lr == pytest.approx(1e-6)
    assert cfg.explorer.engine == "vllm"
    assert (cfg.explorer.sampling.temperature, cfg.explorer.sampling.top_p) == (0.7, 0.95)
    # 3 epochs x (600 rows // 256 prompts per step); verl drops the last partial batch
    assert cfg.trainer.total_steps == 3 * 2
    # 8 GPUs, time-shared by verl; here training and generation run at once: 4 workers a GPU each, and 2 engines
    # of verl's default tensor_model_parallel_size 2
    assert (cfg.trainer.num_workers, cfg.explorer.num_engines) == (4, 2)
    assert cfg.trainer.gpus_per_worker == 1.0 and cfg.explorer.gpus_per_engine == 2.0
    assert cfg.trainer.save_interval == 100 and cfg.name == "my_experiment"
    assert cfg.project == default_leaves()["trainer.project_name"]
    # verl's meaning: on-policy, the old policy recomputed by the trainer, every checkpoint kept
    assert cfg.mode == "sync" and cfg.algorithm.off_policy.recompute_old_log_probs is True
    assert cfg.trainer.keep_checkpoints == 0


def test_translation_records_what_each_key_did(tmp_path, data_files, tiny_model_path):
    train, val = data_files
    tree = yaml.safe_load(SEED_PPO.format(train=train, val=val, model=tiny_model_path))
    tr = translate(tree, tmp_path / "verl.yaml")
    applied = {k: how for k, _, how in tr.applied}
    assert applied["actor_rollout_ref.actor.ppo_mini_batch_size"] == "trainer.mini_batch_size=512"
    assert "(verl's default)" in applied["actor_rollout_ref.actor.entropy_coeff"]
    assert applied["data.max_prompt_length"].startswith("explorer.max_prompt_tokens=512")
    no_effect = {k for k, _, _ in tr.no_effect}
    assert {"actor_rollout_ref.rollout.log_prob_micro_batch_size", "trainer.async_weight_update"} <= no_effect
    assert not tr.unmapped


GRPO = """\
data:
  train_files: {train}
  train_batch_size: 2
  max_response_length: 8
algorithm:
  adv_estimator: grpo
  gamma: 1.0
  lam: 1.0
actor_rollout_ref:
  model:
    path: {model}
  rollout:
    name: hf
    n: 4
  actor:
    use_kl_loss: true
    kl_loss_coef: 0.001
    kl_loss_type: low_var
    loss_agg_mode: token-mean
    ppo_mini_batch_size: 2
    ppo_micro_batch_size_per_gpu: 4
    optim:
      lr: 0.01
trainer:
  total_training_steps: 2
  n_gpus_per_node: 1
  device: cpu
  logger: [console]
  project_name: verl_grpo
  experiment_name: {name}
  default_local_dir: {root}/${{trainer.project_name}}/${{trainer.experiment_name}}
"""


def test_grpo_config(tmp_path, tiny_model_path):
    train = verl_data(tmp_path / "train.parquet")
    cfg = load_config(write(tmp_path, GRPO.format(train=train, model=tiny_model_path, name="g", root=tmp_path / "ck")))
    assert cfg.algorithm.adv_estimator == "grpo" and cfg.explorer.repeat_times == 4
    assert cfg.trainer.total_steps == 2 and cfg.trainer.mini_batch_size == 8 and cfg.trainer.micro_batch_size == 4
    assert cfg.checkpoint_root_dir == str(tmp_path / "ck") and (cfg.project, cfg.name) == ("verl_grpo", "g")
    assert (cfg.trainer.num_workers, cfg.trainer.gpus_per_worker) == (1, 0.0)  # device cpu: no GPU asked for
    assert cfg.monitor.backends == []
    assert cfg.trainer.optimizer.lr == pytest.approx(0.01)


def test_a_verl_job_of_no_gpus_trains_on_the_cpu(tmp_path, tiny_model_path):
    """verl's default `trainer.device: cuda` follows the GPUs the job asks for: a job of `n_gpus_per_node: 0`
    with the hf rollout (no `trainer.device` written) used to get `cuda` and be refused at start on a CPU machine
    ("trainer.device is cuda but this trainer worker sees no GPU"). A job of GPUs keeps verl's default."""
    train = verl_data(tmp_path / "train.parquet")
    no_gpus = GRPO.replace("  device: cpu\n", "").replace("n_gpus_per_node: 1", "n_gpus_per_node: 0")
    cfg = load_config(write(tmp_path, no_gpus.format(train=train, model=tiny_model_path, name="cpu",
                                                     root=tmp_path / "ck")))
    assert cfg.trainer.device == "cpu" and cfg.explorer.engine == "hf"
    assert (cfg.trainer.gpus_per_worker, cfg.explorer.gpus_per_engine) == (0.0, 0.0)
    one_gpu = GRPO.replace("  device: cpu\n", "")
    cfg = load_config(write(tmp_path, one_gpu.format(train=train, model=tiny_model_path, name="gpu",
                                                     root=tmp_path / "ck"), name="gpu.yaml"))
    assert cfg.trainer.device == "cuda" and cfg.trainer.gpus_per_worker == 0.5


def test_a_short_verl_config_means_what_it_means_to_verl(tmp_path, tiny_model_path):
    train = verl_data(tmp_path / "train.parquet", n=2048)
    cfg = load_config(write(tmp_path, f"""\
        data:
          train_files: {train}
        actor_rollout_ref:
          model:
            path: {tiny_model_path}
        trainer:
          device: cpu
          n_gpus_per_node: 1
        """))
    # verl's defaults, not ours: lr 1e-6, one sample per prompt, 1024 prompts per step, gae, 30 epochs of 2 steps
    assert cfg.trainer.optimizer.lr == pytest.approx(1e-6) and cfg.explorer.repeat_times == 1
    assert cfg.explorer.batch_size == 1024 and cfg.algorithm.adv_estimator == "gae"
    assert cfg.trainer.total_steps == 30 * 2 and cfg.explorer.sampling.max_new_tokens == 512


@pytest.mark.parametrize("snippet,refused", [
    ("actor_rollout_ref: {model: {backend: megatron}, actor: {strategy: megatron, tensor_model_parallel_size: 8, "
     "pipeline_model_parallel_size: 2, megatron: {use_mbridge: true}}}",
     {"actor_rollout_ref.model.backend", "actor_rollout_ref.actor.strategy",
      "actor_rollout_ref.actor.tensor_model_parallel_size", "actor_rollout_ref.actor.pipeline_model_parallel_size",
      "actor_rollout_ref.actor.megatron.use_mbridge"}),
    ("actor_rollout_ref: {rollout: {name: sglang, tp_size: 2, mem_fraction_static: 0.8, context_length: 8192}}",
     {"actor_rollout_ref.rollout.name", "actor_rollout_ref.rollout.tp_size",
      "actor_rollout_ref.rollout.mem_fraction_static", "actor_rollout_ref.rollout.context_length"}),
    ("actor_rollout_ref: {rollout: {name: vllm, enable_vision: true, max_model_len: 32768}}",
     {"actor_rollout_ref.rollout.enable_vision"}),
    ("reward_model: {enable: true, model: {trust_remote_code: true}}", {"reward_model.model.trust_remote_code"}),
    ("trainer: {default_hdfs_dir: hdfs://x/y}", {"trainer.default_hdfs_dir"}),
])
def test_keys_without_counterpart_are_named_in_one_message(tmp_path, tiny_model_path, snippet, refused):
    train = verl_data(tmp_path / "train.parquet")
    base = {"data": {"train_files": str(train)}, "actor_rollout_ref": {"model": {"path": str(tiny_model_path)}},
            "trainer": {"device": "cpu", "n_gpus_per_node": 1}}
    extra = yaml.safe_load(snippet)
    for section, value in extra.items():
        base[section] = _deep_merge(base.get(section, {}), value)
    path = tmp_path / "verl.yaml"
    path.write_text(yaml.safe_dump(base))
    with pytest.raises(ConfigError) as e:
        load_config(path)
    message = str(e.value)
    assert f"{len(refused)} key(s) have no counterpart" in message and "--allow-unmapped" in message
    assert all(k in message for k in refused), message
    # with --allow-unmapped the run goes on without them, and they are listed
    tr = translate(base, path, allow_unmapped=True)
    assert {k for k, _, _ in tr.unmapped} == refused
    assert {d["verl"] for d in tr.report()["ignored_unmapped"]} == refused


@pytest.mark.parametrize("gpus,split", [
    # G: (trainer workers, GPUs each, engines, GPUs each, reward model's GPUs)
    (1, (1, 0.5, 1, 0.25, 0.25)),
    (2, (1, 1.0, 1, 0.5, 0.5)),
    (4, (1, 1.0, 2, 1.0, 1.0)),
    (8, (3, 1.0, 4, 1.0, 1.0)),
])
def test_a_reward_model_is_served_and_given_its_share_of_the_gpus(tmp_path, tiny_model_path, gpus, split):
    train = verl_data(tmp_path / "train.parquet")
    rm = tmp_path / "rm"
    rm.mkdir()
    tree = {"data": {"train_files": str(train)}, "actor_rollout_ref": {"model": {"path": str(tiny_model_path)}},
            "reward_model": {"enable": True, "model": {"path": "rm", "input_tokenizer": str(tiny_model_path)},
                             "micro_batch_size_per_gpu": 4, "max_length": 300},
            "trainer": {"n_gpus_per_node": gpus}}
    tree["actor_rollout_ref"]["rollout"] = {"tensor_model_parallel_size": 1}
    native = translate(tree, tmp_path / "verl.yaml").native
    assert native["reward.model.path"] == str(rm)  # relative to the config file, as verl's other paths
    assert native["reward.model.combine"] == "replace"  # verl: the model's score replaces the function's
    assert (native["reward.model.micro_batch_size"], native["reward.model.max_length"]) == (4, 300)
    got = (native["trainer.num_workers"], native["trainer.gpus_per_worker"], native["explorer.num_engines"],
           native["explorer.gpus_per_engine"], native["reward.model.num_gpus"])
    assert got == split
    assert got[0] * got[1] + got[2] * got[3] + got[4] == gpus  # every GPU used, none twice
    # without the reward model the split is the plain one, and nothing of the reward model is set
    plain = translate({**tree, "reward_model": {"enable": False, "model": {"path": "rm"}}}, tmp_path / "v.yaml").native
    assert "reward.model.path" not in plain and "reward.model.num_gpus" not in plain


def test_prompt_length_truncation_and_filtering_carry_over(tmp_path, tiny_model_path):
    train = verl_data(tmp_path / "train.parquet")
    base = {"actor_rollout_ref": {"model": {"path": str(tiny_model_path)}}, "trainer": {"device": "cpu"}}
    cfg = load_config(write(tmp_path, yaml.safe_dump({**base, "data": {
        "train_files": str(train), "max_prompt_length": 64, "truncation": "middle", "filter_overlong_prompts": True}})))
    assert (cfg.explorer.max_prompt_tokens, cfg.explorer.prompt_truncation) == (64, "middle")
    assert cfg.explorer.filter_overlong_prompts
    cfg = load_config(write(tmp_path, yaml.safe_dump({**base, "data": {"train_files": str(train)}}), "short.yaml"))
    assert (cfg.explorer.max_prompt_tokens, cfg.explorer.prompt_truncation) == (512, "error")  # verl's defaults
    assert not cfg.explorer.filter_overlong_prompts
    with pytest.raises(ConfigError, match="allowed values: error, left, right, middle"):
        load_config(write(tmp_path, yaml.safe_dump({**base, "data": {"train_files": str(train), "truncation": "top"}}),
                          "bad.yaml"))


def _deep_merge(a: dict, b: dict) -> dict:
    out = dict(a)
    for k, v in b.items():
        out[k] = _deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def test_fsdp2_lora_and_multi_turn(tmp_path, tiny_model_path):
    train = verl_data(tmp_path / "train.parquet")
    cfg = load_config(write(tmp_path, f"""\
        data: {{train_files: {train}}}
        actor_rollout_ref:
          model: {{path: {tiny_model_path}}}
          actor:
            strategy: fsdp2
            fsdp_config: {{offload_policy: true, reshard_after_forward: true}}
        trainer: {{device: cpu, n_gpus_per_node: 1}}
        """, "fsdp2.yaml"))
    assert cfg.trainer.strategy == "fsdp2"
    tools = tmp_path / "tools.yaml"
    tools.write_text((Path(__file__).resolve().parents[2] / "examples" / "tool_calculator" / "tools.yaml").read_text())
    cfg = load_config(write(tmp_path, f"""\
        data: {{train_files: {train}}}
        actor_rollout_ref:
          model: {{path: {tiny_model_path}, lora_rank: 16, lora_alpha: 32, target_modules: all-linear}}
          rollout:
            name: vllm
            multi_turn: {{enable: true, tool_config_path: {tools}, max_assistant_turns: 3}}
        trainer: {{device: cpu, n_gpus_per_node: 1}}
        """))
    assert cfg.trainer.lora.enabled and (cfg.trainer.lora.r, cfg.trainer.lora.alpha) == (16, 32)
    assert "gate_proj" in cfg.trainer.lora.target_modules
    assert cfg.explorer.workflow == "tool_agent" and cfg.explorer.tool_config_path == str(tools)
    assert cfg.explorer.max_turns == 3


def test_two_keys_that_disagree_are_refused(tmp_path, tiny_model_path):
    train = verl_data(tmp_path / "train.parquet")
    with pytest.raises(ConfigError, match="both set 'trainer.optimizer.lr'"):
        load_config(write(tmp_path, f"""\
            data: {{train_files: {train}}}
            actor_rollout_ref:
              model: {{path: {tiny_model_path}}}
              actor: {{lr: 1e-5, optim: {{lr: 1e-6}}}}
            trainer: {{device: cpu, n_gpus_per_node: 1}}
            """))


def test_config_convert_prints_an_equivalent_native_config(tmp_path, tiny_model_path, capsys):
    train = verl_data(tmp_path / "train.parquet")
    path = write(tmp_path, GRPO.format(train=train, model=tiny_model_path, name="c", root=tmp_path / "ck"))
    assert main(["config-convert", str(path)]) == 0
    native = tmp_path / "native.yaml"
    native.write_text(capsys.readouterr().out)
    assert "actor_rollout_ref" not in native.read_text()
    assert load_config(native) == load_config(path)
    assert main(["config-convert", str(native)]) == 2  # already one of ours
    assert "not a verl-shaped config" in capsys.readouterr().err


def test_run_translates_a_verl_file_once_and_keeps_that_translation(tmp_path, tiny_model_path, monkeypatch,
                                                                    capsys):
    import trinity_like.config.verl as verl
    import trinity_like.launcher

    train = verl_data(tmp_path / "train.parquet")
    tree = yaml.safe_load(GRPO.format(train=train, model=tiny_model_path, name="once", root=tmp_path / "ck"))
    tree["trainer"]["a_key_verl_does_not_have"] = 1
    path = tmp_path / "verl.yaml"
    path.write_text(yaml.safe_dump(tree))
    translate_once = verl.translate
    calls = []
    monkeypatch.setattr(verl, "translate", lambda *a, **k: calls.append(a) or translate_once(*a, **k))
    monkeypatch.setattr(trinity_like.launcher, "run", lambda cfg, **_: {"exit_reason": "completed"})
    assert main(["run", str(path), "--allow-unmapped"]) == 0
    assert len(calls) == 1  # load_config's translation is the one kept: no second YAML parse or Parquet count
    kept = yaml.safe_load((tmp_path / "ck" / "verl_grpo" / "once" / "verl_translation.yaml").read_text())
    assert kept == translate_once(yaml.safe_load(path.read_text()), path, allow_unmapped=True).report()
    assert "ignored 1 key(s) with no counterpart here: trainer.a_key_verl_does_not_have" in capsys.readouterr().out


def test_docs_verl_md_is_up_to_date():
    assert DOCS_PATH.read_text() == render_docs(), "docs/verl.md is out of date; regenerate it with " \
                                                   "`python -m trinity_like.config.verl`"


# ---------------------------------------------------------------- data


def test_verl_data_file_reads_as_tasks_with_chat_prompts(tmp_path, tiny_model_path):
    from trinity_like.common.chat import render_ids
    from trinity_like.common.tokenizer import hf_tokenizer

    tasks = load_taskset(verl_data(tmp_path / "train.parquet", n=3))
    assert [t.task_id for t in tasks] == ["train-0", "train-1", "train-2"]
    t = tasks[2]
    assert (t.prompt, t.answer, t.data_source) == ("2+3=", "5", "arithmetic")
    assert t.extra_info == {"split": "train", "index": 2, "question": "2+3"}
    assert [m["role"] for m in t.messages] == ["system", "user"]
    tok = hf_tokenizer(str(tiny_model_path))
    ids = prompt_ids(t, tok)
    assert ids == list(render_ids(list(t.messages), tok, add_generation_prompt=True))
    assert len(ids) > len(tok.encode("2+3="))  # the system message and the role headers are in it


def test_verl_data_file_with_a_bad_row_is_refused_naming_it(tmp_path):
    rows = [{"data_source": "x", "prompt": [{"role": "user", "content": "1+1="}],
             "reward_model": {"style": "rule", "ground_truth": "2"}, "extra_info": {"index": 0}},
            {"data_source": "x", "prompt": [{"role": "user", "content": "1+2="}],
             "reward_model": {"style": "rule", "ground_truth": None}, "extra_info": {"index": 1}}]
    path = tmp_path / "bad.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    with pytest.raises(ValueError, match="row 1: reward_model has no ground_truth"):
        load_taskset(path)


# ---------------------------------------------------------------- reward functions


def test_verl_per_sample_reward_signature(tmp_path):
    f = tmp_path / "reward.py"
    f.write_text(textwrap.dedent("""\
        def compute_score(data_source, solution_str, ground_truth, extra_info=None):
            bonus = extra_info.get("bonus", 0.0) if extra_info else 0.0
            if data_source == "dict":
                return {"score": 0.5 + bonus, "acc": True}
            return float(solution_str.strip() == ground_truth) + bonus
        """))
    fn = load_reward_function(f)
    assert fn(["3", "4", "x"], ["3", "3", "y"], data_sources=["a", "a", "dict"],
              extra_infos=[{}, {"bonus": 0.25}, {"bonus": 0.1}]) == [1.0, 0.25, 0.6]
    manager = NaiveRewardManager(tokenizer=None, compute_score=fn)
    scores, info = manager.score(["3", "4"], ["3", "4"], ["a", "a"], [1, 1], [{"bonus": 1.0}, {}])
    assert scores == [2.0, 1.0] and info["reward_failed"] == [False, False]


def test_batched_reward_signatures_get_the_keywords_they_name():
    def plain(responses, ground_truths):
        return [float(r == g) for r, g in zip(responses, ground_truths, strict=True)]

    def with_sources(responses, ground_truths, data_sources):
        return [float(s == "a") for s in data_sources]

    assert as_batched_reward_fn(plain)(["1", "2"], ["1", "1"], data_sources=["a", "b"], extra_infos=[{}, {}]) == [1.0, 0.0]
    assert as_batched_reward_fn(with_sources)(["1", "2"], ["1", "1"], data_sources=["a", "b"]) == [1.0, 0.0]


def test_reward_kwargs_are_bound_to_the_reward_function_of_either_signature(tmp_path, tiny_model_path):
    f = tmp_path / "reward.py"
    f.write_text(textwrap.dedent("""\
        def compute_score(data_source, solution_str, ground_truth, extra_info=None, scale=1.0, weights=None):
            return scale * float(solution_str == ground_truth) + weights["format"]

        def batched(responses, ground_truths, scale=1.0):
            return [scale * float(r == g) for r, g in zip(responses, ground_truths)]
        """))
    train = verl_data(tmp_path / "train.parquet")
    cfg = load_config(write(tmp_path, yaml.safe_dump({
        "data": {"train_files": str(train)}, "actor_rollout_ref": {"model": {"path": str(tiny_model_path)}},
        "trainer": {"device": "cpu"},
        "custom_reward_function": {"path": str(f), "reward_kwargs": {"scale": 2.0, "weights": {"format": 0.5}}}})))
    assert cfg.reward.function_kwargs == {"scale": 2.0, "weights": {"format": 0.5}}
    manager = load_reward_manager(cfg, None)
    assert manager.score(["3", "4"], ["3", "3"], ["a", "a"])[0] == [2.5, 0.5]
    assert load_reward_function(f, "batched", {"scale": 3.0})(["3", "4"], ["3", "3"], data_sources=["a", "a"]) == \
        [3.0, 0.0]
    with pytest.raises(TypeError, match=r"takes no argument\(s\) bias \(reward.function_kwargs\)"):
        load_reward_function(f, "batched", {"bias": 1.0})


# ---------------------------------------------------------------- dapo under its name


def test_dapo_turns_on_its_parts_and_each_stays_settable():
    from trinity_like.config import load_config

    cfg = load_config(None, ["algorithm.adv_estimator=dapo", "explorer.sampling.max_new_tokens=20"])
    assert cfg.algorithm.clip_ratio_high == 0.28 and cfg.algorithm.clip_ratio_low == 0.2
    assert cfg.algorithm.loss_agg_mode == "token-mean" and not cfg.algorithm.use_kl_loss
    assert cfg.explorer.dynamic_sampling and cfg.reward.manager == "dapo"
    ob = cfg.reward.overlong_buffer
    assert (ob.enable, ob.len, ob.penalty_factor) == (True, 20 // 5, 1.0)
    mine = load_config(None, ["algorithm.adv_estimator=dapo", "algorithm.clip_ratio_high=0.3",
                              "explorer.dynamic_sampling=false", "reward.overlong_buffer.enable=false"])
    assert mine.algorithm.clip_ratio_high == 0.3 and not mine.explorer.dynamic_sampling
    assert not mine.reward.overlong_buffer.enable
    assert not load_config(None, ["algorithm.adv_estimator=grpo"]).explorer.dynamic_sampling
