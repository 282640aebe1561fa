"""The SFT warm-up stage: demonstrations, config checks, and warm-up -> RL end to end with evaluations."""

import json
import re

import pytest
import yaml

from trinity_like.common.errors import UserError
from trinity_like.common.tasks import demonstrations, generate_arithmetic
from trinity_like.config import ConfigError, load_config
from trinity_like.runtime.paths import RunPaths
from trinity_like.warmup import demonstration_experiences, demonstration_records, write_demonstrations

SUM = re.compile(r"^(\d+)\+(\d+)=$")


def test_generated_demonstrations_answer_the_sum_in_the_prompt():
    records = demonstrations(generate_arithmetic(200, 15, seed=5))
    assert len(records) == 200
    for r in records:
        user, assistant = r["messages"]
        assert (user["role"], assistant["role"]) == ("user", "assistant")
        a, b = map(int, SUM.match(user["content"]).groups())
        assert 0 <= a <= 15 and 0 <= b <= 15
        assert assistant["content"] == str(a + b)
        assert r["reward"] == 1.0
    assert len({r["task_id"] for r in records}) == 200


def test_demonstrations_tokenize_as_the_single_turn_workflow_prompts(tiny_model_path, tmp_path):
    from trinity_like.common.tokenizer import hf_tokenizer

    tok = hf_tokenizer(tiny_model_path)
    cfg = load_config(None, [f"model.path={tiny_model_path}", "warmup.num_demonstrations=40",
                             "warmup.max_operand=7", "explorer.taskset.max_operand=99", "seed=3"])
    numbered = demonstration_records(cfg)
    assert [n for n, _ in numbered] == list(range(1, 41))
    exps = demonstration_experiences(numbered, tok, "generated")
    for exp in exps:
        prompt = tok.decode(exp.prompt_ids)
        a, b = map(int, SUM.match(prompt).groups())
        assert a <= 7 and b <= 7  # warmup.max_operand wins over the task set's
        assert list(exp.prompt_ids) == tok.encode(prompt)  # what SingleTurnWorkflow sends
        assert list(exp.response_ids) == tok.encode(str(a + b)) + [tok.eos_token_id]
        assert exp.model_version == -1 and exp.reward == 1.0
    # the generated ones are seeded apart from the training task set of the same seed
    train_prompts = [t.prompt for t in generate_arithmetic(40, 7, seed=3)]
    assert [tok.decode(e.prompt_ids) for e in exps] != train_prompts

    # a file of chat records and Experience rows; the first N are taken
    demo_file = tmp_path / "demos.jsonl"
    rows = [{"messages": [{"role": "system", "content": "2+"}, {"role": "user", "content": "3="},
                          {"role": "assistant", "content": "5"}]},
            {"prompt_ids": tok.encode("1+1="), "response_ids": tok.encode("2") + [tok.eos_token_id]},
            {"messages": [{"role": "user", "content": "9+9="}, {"role": "assistant", "content": "18"}]}]
    demo_file.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = load_config(None, [f"model.path={tiny_model_path}", f"warmup.demonstrations={demo_file}",
                             "warmup.num_demonstrations=2"])
    out = tmp_path / "out.jsonl"
    assert write_demonstrations(cfg, out) == 2
    from trinity_like.common.experience import Experience

    written = [Experience.from_json(line) for line in out.read_text().splitlines()]
    assert [tok.decode(e.prompt_ids) for e in written] == ["2+3=", "1+1="]
    assert [tok.decode(e.response_ids, skip_special_tokens=True) for e in written] == ["5", "2"]


def test_unusable_demonstrations_are_refused_with_their_line(tiny_model_path, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"messages": [{"role": "user", "content": "1+1="},
                                            {"role": "assistant", "content": "2"}]}) + "\n"
                   + json.dumps({"messages": [{"role": "assistant", "content": "2"}]}) + "\n")
    cfg = load_config(None, [f"model.path={tiny_model_path}", f"warmup.demonstrations={bad}"])
    with pytest.raises(UserError, match="line 2 .*prompt turn followed by an assistant turn"):
        write_demonstrations(cfg, tmp_path / "out.jsonl")
    multi = tmp_path / "multi.jsonl"
    multi.write_text(json.dumps({"messages": [{"role": "user", "content": "1+1="},
                                              {"role": "assistant", "content": "2"},
                                              {"role": "user", "content": "sure?"}]}) + "\n")
    cfg = load_config(None, [f"model.path={tiny_model_path}", f"warmup.demonstrations={multi}"])
    with pytest.raises(UserError, match="line 1 .*single-turn"):
        write_demonstrations(cfg, tmp_path / "out.jsonl")


@pytest.mark.parametrize("overrides, needle", [
    (["warmup.sft_steps=-1"], r"bad value for 'warmup\.sft_steps': -1; it must be at least 0"),
    (["warmup.batch_size=0"], r"bad value for 'warmup\.batch_size': 0; it must be at least 1"),
    (["warmup.lr=-0.1"], r"bad value for 'warmup\.lr'"),
    (["warmup.num_demonstrations=0"], r"bad value for 'warmup\.num_demonstrations'"),
    (["warmup.max_operand=0"], r"bad value for 'warmup\.max_operand'"),
    (["warmup.steps=3"], r"unknown config key 'warmup\.steps'; valid keys under 'warmup': sft_steps"),
    (["warmup.sft_steps=3"], r"explorer\.eval_tasksets, which is empty"),
    (["warmup.sft_steps=3", "mode=offline", "buffer.replay_sources=[x]",
      "explorer.eval_tasksets=[{name: e}]"], r"mode 'offline' is not"),
    (["warmup.demonstrations=/nonexistent/demos.jsonl"], r"warmup\.demonstrations '/nonexistent/demos\.jsonl' is not"),
])
def test_bad_warmup_values_are_config_errors(overrides, needle):
    with pytest.raises(ConfigError, match=needle):
        load_config(None, overrides)


def test_quickstart_warms_up_and_evaluates_held_out_tasks():
    from pathlib import Path

    cfg = load_config(Path(__file__).resolve().parents[1] / "configs" / "quickstart.yaml")
    assert cfg.warmup.sft_steps > 0 and cfg.mode == "async"
    assert cfg.algorithm.adv_estimator == "grpo" and cfg.algorithm.off_policy.correction != "none"
    ev = cfg.explorer.eval_tasksets[0]
    assert ev.temperature == 0 and ev.k == 1 and 64 <= ev.size <= 128


def _greedy_accuracy(model_path, tasks, max_new_tokens):
    """Held-out accuracy worked out here, apart from the code under test: greedy answers, exact sums."""
    from trinity_like.common.tokenizer import hf_tokenizer
    from trinity_like.config import SamplingConfig
    from trinity_like.explorer.engines.hf_engine import HFEngine

    tok = hf_tokenizer(str(model_path))
    samples = HFEngine(model_path, device="cpu").generate([tok.encode(t.prompt) for t in tasks],
                                            SamplingConfig(temperature=0.0, max_new_tokens=max_new_tokens),
                                            list(range(len(tasks))))
    answers = [re.match(r"\s*(-?\d+)", tok.decode(s.response_ids.tolist(), skip_special_tokens=True)) for s in samples]
    return sum(m is not None and m.group(1) == t.answer for m, t in zip(answers, tasks, strict=True)) / len(tasks)


@pytest.mark.slow
def test_warmup_then_rl_writes_evaluations(tmp_path, tiny_model_path, ray_session):
    import torch
    from safetensors.torch import load_file

    from trinity_like.common.errors import RunError
    from trinity_like.common.tasks import load_taskset
    from trinity_like.launcher import run
    cfg = load_config(None, [
        f"checkpoint_root_dir={tmp_path}", "project=warmup", "name=wu", f"model.path={tiny_model_path}",
        "mode=async", "explorer.batch_size=2", "explorer.repeat_times=4", "explorer.sampling.max_new_tokens=3",
        "explorer.taskset.size=16", "explorer.taskset.max_operand=2", "trainer.total_steps=2",
        "trainer.micro_batch_size=8", "trainer.optimizer.lr=0.001", "algorithm.off_policy.correction=decoupled",
        "explorer.eval_tasksets=[{name: heldout, size: 12, max_operand: 2}]",
        "warmup.sft_steps=4", "warmup.num_demonstrations=16", "warmup.batch_size=16", "warmup.lr=0.003",
    ])
    summary = run(cfg)
    rl, warm = RunPaths.of(cfg), RunPaths.of(load_config(None, [f"checkpoint_root_dir={tmp_path}",
                                                                "project=warmup", "name=wu-warmup"]))
    assert json.loads(rl.summary.read_text()) == summary
    # the RL summary is all there, with the evaluations and the warm-up's figures merged in
    assert summary["exit_reason"] == "completed" and summary["trainer_steps"] == 2 and summary["mode"] == "async"
    assert summary["reward_mean_first_10"] is not None and summary["staleness_max"] <= 1
    assert summary["warmup_steps"] == 4 and summary["warmup_demonstrations"] == 16
    assert summary["eval_taskset"] == "heldout" and summary["eval_tasks"] == 12

    # the SFT stage was an offline run on the demonstrations, its full-batch NLL falling step after step
    warm_records = [json.loads(x) for x in warm.metrics.read_text().splitlines()]
    nll = [r["actor/pg_loss"] for r in warm_records if r["role"] == "trainer"]
    assert len(nll) == 4 and all(a > b for a, b in zip(nll, nll[1:], strict=False))
    assert summary["warmup_loss_first"] == round(nll[0], 4) and summary["warmup_loss_last"] == round(nll[-1], 4)
    warm_cfg = yaml.safe_load(warm.config.read_text())
    assert warm_cfg["mode"] == "offline" and warm_cfg["algorithm"]["policy_loss"] == "sft"

    # the RL run started from the warm-up's last checkpoint, which the SFT steps moved
    warm_model = warm.checkpoint_dir / "step_4" / "model"
    assert yaml.safe_load(rl.config.read_text())["model"]["path"] == str(warm_model)
    base, warmed = load_file(f"{tiny_model_path}/model.safetensors"), load_file(str(warm_model / "model.safetensors"))
    assert any(not torch.equal(base[k], warmed[k]) for k in base)

    # each figure is the greedy accuracy of the right model on the same held-out tasks, checked apart
    tasks = load_taskset(rl.run_dir / "eval-heldout.parquet")
    assert len(tasks) == 12
    final_model = rl.checkpoint_dir / "step_2" / "model"
    for key, model in (("eval_initial", tiny_model_path), ("eval_before", warm_model), ("eval_after", final_model)):
        assert summary[key] == pytest.approx(_greedy_accuracy(model, tasks, 3), abs=1e-4), key

    with pytest.raises(RunError, match="already holds a run"):  # refused before any work
        run(cfg)
