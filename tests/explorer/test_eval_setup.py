"""An eval task set is read and scored by its own Trinity-shaped keys (format, workflow, reward_fn and args) where
it gives them, as a Trinity eval task set has its own, else by the training set's and the explorer's workflow."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from trinity_like.common.tasks import Task
from trinity_like.config import SamplingConfig, load_config
from trinity_like.config.schema import EvalTasksetConfig
from trinity_like.explorer.evaluation import eval_setup, evaluate
from trinity_like.explorer.workflow_base import WorkflowContext
from trinity_like.explorer.workflows import SingleTurnWorkflow, load_workflow


class LocalEngine:
    """The fleet's ``generate`` over one in-process engine (the real tiny model)."""

    def __init__(self, engine) -> None:
        self.engine, self.version = engine, 0

    async def generate(self, prompts, sampling, seeds):
        return self.engine.generate(prompts, sampling, seeds)

    generate_spread = generate


def _ctx(cfg, tokenizer):
    return WorkflowContext(sampling=SamplingConfig(max_new_tokens=8), repeat_times=1, seeds=[0], tokenizer=tokenizer,
                           reward_manager=SimpleNamespace(score=None), taskset=cfg.explorer.taskset)


def test_eval_set_keys_override_the_training_sets_and_fall_back_to_them(tiny_model_path):
    from trinity_like.common.tokenizer import hf_tokenizer

    tok = hf_tokenizer(tiny_model_path)
    cfg = load_config(None, ["explorer.taskset.reward_fn=format_reward",
                             "explorer.taskset.reward_fn_args={pattern: 'never-matches'}"])
    base = SingleTurnWorkflow()
    inherits = EvalTasksetConfig(name="plain")
    ctx, wf = eval_setup(cfg, inherits, _ctx(cfg, tok), base)
    assert wf is base and ctx.taskset.reward_fn == "format_reward"
    assert ctx.taskset.reward_fn_args == {"pattern": "never-matches"}  # the training set's, with its reward_fn

    own = EvalTasksetConfig(name="own", reward_fn="format_reward", reward_fn_args={"pattern": ".*"},
                            workflow="math_boxed_workflow")
    own.format.response_key = "solution"
    ctx, wf = eval_setup(cfg, own, _ctx(cfg, tok), base)
    assert ctx.taskset.reward_fn_args == {"pattern": ".*"} and ctx.taskset.format.response_key == "solution"
    assert type(wf) is type(load_workflow("math_boxed_workflow"))
    assert cfg.explorer.taskset.format.response_key == "response"  # the training set's config is untouched

    # scored through evaluate: the eval set's reward function gives +0.1 to any response, the training set's 0
    task = Task("t0", "1+1=", "2")
    from trinity_like.explorer.engines.hf_engine import HFEngine

    engine = LocalEngine(HFEngine(tiny_model_path, device="cpu"))
    plain = EvalTasksetConfig(name="plain", format=own.format, reward_fn="format_reward",
                              reward_fn_args={"pattern": ".*"})
    ev_ctx, ev_wf = eval_setup(cfg, plain, _ctx(cfg, tok), base)
    m = asyncio.run(evaluate(engine, ev_ctx, "plain", [task], plain, workflow=ev_wf))
    assert m["eval/plain/reward_mean"] == pytest.approx(0.1)
    ev_ctx, ev_wf = eval_setup(cfg, inherits, _ctx(cfg, tok), base)
    m = asyncio.run(evaluate(engine, ev_ctx, "inherits", [task], inherits, workflow=ev_wf))
    assert m["eval/inherits/reward_mean"] == pytest.approx(-0.1)  # format_reward's -0.1: the pattern never matches
