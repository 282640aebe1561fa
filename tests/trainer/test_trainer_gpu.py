"""The trainer on a CUDA GPU (``pytest -m gpu``; skipped on a machine without one). One GPU is enough for all of
them: data parallelism over NCCL needs two GPUs and is not tested here."""

import pytest
import torch

from trinity_like.common.modeling import load_causal_lm
from trinity_like.config import load_config
from trinity_like.trainer.ppo import PPOTrainer

pytestmark = pytest.mark.gpu


def _trainer(tmp_path, model_path, *overrides):
    cfg = load_config(None, [f"checkpoint_root_dir={tmp_path}", "project=gpu", "name=t", f"model.path={model_path}",
                             "explorer.batch_size=4", "explorer.repeat_times=3", "trainer.micro_batch_size=4",
                             "trainer.optimizer.lr=0.01", "trainer.logprob_chunk_tokens=16", *overrides])
    t = PPOTrainer(cfg)
    t.prepare()
    return t


def test_fp32_step_on_cuda_equals_the_cpu_step(tmp_path, tiny_model_path, batch_exps):
    """float32 on CUDA (TF32 off, torch's default) against float32 on the CPU, the tiny model: grad norm within
    1e-4 relative; after one AdamW step at lr 0.01, weights within 1e-5 but for at most 0.1% of them, and every one
    within 2 x lr. AdamW's first step moves each weight by lr * g / (|g| + eps): where a gradient entry is near
    zero, the last bits that different kernels leave in it change that step by up to 2 x lr (on the lent H100: 4
    of 50,048 entries, by up to 3.8e-5)."""
    cpu = _trainer(tmp_path / "cpu", tiny_model_path, "trainer.device=cpu")
    gpu = _trainer(tmp_path / "gpu", tiny_model_path, "trainer.device=cuda")
    assert next(gpu.module.parameters()).device.type == "cuda"
    m_cpu, m_gpu = cpu.train_step(batch_exps), gpu.train_step(batch_exps)
    assert m_gpu["actor/grad_norm"] == pytest.approx(m_cpu["actor/grad_norm"], rel=1e-4)
    w_cpu, w_gpu = cpu.policy_state_dict(), gpu.policy_state_dict()
    assert all(t.device.type == "cpu" for t in w_gpu.values())  # weights leave the trainer on the CPU
    diff = torch.cat([(w_gpu[k].float() - w_cpu[k].float()).abs().flatten() for k in w_cpu])
    assert float(diff.max()) <= 2 * 0.01 + 1e-6
    assert int((diff > 1e-5).sum()) <= 1e-3 * diff.numel()


@pytest.mark.parametrize("overrides", [
    ["algorithm.adv_estimator=gae"],
    ["algorithm.adv_estimator=opmd", "algorithm.opmd_baseline=logavgexp"],
    ["algorithm.adv_estimator=rloo", "algorithm.off_policy.correction=decoupled"],
    ["algorithm.adv_estimator=reinforce_plus_plus_baseline", "algorithm.off_policy.correction=icepop"],
    ["algorithm.off_policy.correction=seq_mis", "algorithm.use_kl_loss=true", "algorithm.entropy_coeff=0.01"],
    ["algorithm.use_kl_in_reward=true", "trainer.ppo_epochs=2", "trainer.mini_batch_size=6"],
], ids=["gae", "opmd", "rloo-decoupled", "rpp-icepop", "seq_mis-kl-entropy", "kl_in_reward-epochs"])
def test_every_part_of_the_step_runs_on_cuda_like_on_the_cpu(tmp_path, tiny_model_path, batch_exps, overrides):
    """No tensor of an estimator, correction or loss is left on the CPU (a device mismatch raises); float32 on
    CUDA against float32 on the CPU, grad norm within 1e-4 relative (1e-6 absolute for a near-zero norm)."""
    cpu = _trainer(tmp_path / "cpu", tiny_model_path, "trainer.device=cpu", *overrides)
    gpu = _trainer(tmp_path / "gpu", tiny_model_path, "trainer.device=cuda", *overrides)
    m_cpu, m_gpu = cpu.train_step(batch_exps), gpu.train_step(batch_exps)
    assert m_gpu["actor/grad_norm"] == pytest.approx(m_cpu["actor/grad_norm"], rel=1e-4, abs=1e-6)


def _linear_output_dtypes(module: torch.nn.Module) -> set[torch.dtype]:
    """A forward hook on every linear layer: the dtypes of the activations they produce (filled as it runs)."""
    seen: set[torch.dtype] = set()
    for m in module.modules():
        if isinstance(m, torch.nn.Linear):
            m.register_forward_hook(lambda _m, _inp, out: seen.add(out.dtype))
    return seen


def test_bf16_step_on_cuda_runs_in_bf16_and_stays_close_to_fp32(tmp_path, tiny_model_path, batch_exps):
    """Tolerances for the tiny model on a CUDA GPU, bf16 autocast against fp32 without TF32: pg_loss within 2e-2,
    grad norm within 5%. The hooks prove autocast ran (a silent no-op would pass the closeness check alone)."""
    ref = _trainer(tmp_path / "fp32", tiny_model_path, "trainer.device=cuda")
    bf16 = _trainer(tmp_path / "bf16", tiny_model_path, "trainer.device=cuda", "trainer.dtype=bfloat16")
    seen32, seen16 = _linear_output_dtypes(ref.module), _linear_output_dtypes(bf16.module)
    m32, m16 = ref.train_step(batch_exps), bf16.train_step(batch_exps)
    assert seen32 == {torch.float32} and seen16 == {torch.bfloat16}
    assert all(p.dtype == torch.float32 for p in bf16.module.parameters())
    assert m16["actor/pg_loss"] == pytest.approx(m32["actor/pg_loss"], abs=2e-2)
    assert m16["actor/grad_norm"] == pytest.approx(m32["actor/grad_norm"], rel=5e-2)


@pytest.fixture
def deterministic_cuda():
    """Deterministic kernels for exactness tests: torch's deterministic algorithms (cuBLAS with the fixed
    workspace tests/conftest.py sets before CUDA starts) and the math attention kernel (flash and
    memory-efficient attention accumulate their backward with atomics, in no fixed order)."""
    before = (torch.are_deterministic_algorithms_enabled(), torch.backends.cuda.flash_sdp_enabled(),
              torch.backends.cuda.mem_efficient_sdp_enabled())
    torch.use_deterministic_algorithms(True)
    torch.backends.cuda.enable_flash_sdp(False)
    torch.backends.cuda.enable_mem_efficient_sdp(False)
    yield
    torch.use_deterministic_algorithms(before[0])
    torch.backends.cuda.enable_flash_sdp(before[1])
    torch.backends.cuda.enable_mem_efficient_sdp(before[2])


def test_resume_on_gpu_is_exact_and_the_checkpoint_loads_on_the_cpu(tmp_path, tiny_model_path, batch_exps,
                                                                     deterministic_cuda):
    """fp32 on CUDA with deterministic kernels: the resumed step equals the uninterrupted one to 1e-6."""
    t = _trainer(tmp_path, tiny_model_path, "trainer.device=cuda")
    t.train_step(batch_exps)
    path = t.save_checkpoint()
    second = t.train_step(batch_exps)
    after_two = t.policy_state_dict()
    resumed = _trainer(tmp_path, tiny_model_path, "trainer.device=cuda")
    resumed.load_checkpoint(path)
    again = resumed.train_step(batch_exps)
    assert again["actor/pg_loss"] == pytest.approx(second["actor/pg_loss"], abs=1e-6)
    for k, v in resumed.policy_state_dict().items():
        torch.testing.assert_close(v, after_two[k], rtol=0, atol=1e-6)
    on_cpu = load_causal_lm(path / "model")  # what a CPU-only machine does with it
    assert next(on_cpu.parameters()).device.type == "cpu"


def test_three_step_ray_run_trains_on_cuda_and_its_checkpoint_loads_on_the_cpu(tmp_path, tiny_model_path,
                                                                               ray_session):
    from trinity_like.launcher import run
    from trinity_like.runtime.paths import RunPaths

    cfg = load_config(None, [f"checkpoint_root_dir={tmp_path}", "project=gpu", "name=run", f"model.path={tiny_model_path}",
                             "explorer.batch_size=2", "explorer.repeat_times=4", "explorer.sampling.max_new_tokens=4",
                             "trainer.total_steps=3", "trainer.device=cuda", "trainer.gpus_per_worker=0.5",
                             "trainer.dtype=bfloat16"])
    summary = run(cfg)
    assert summary["exit_reason"] == "completed" and summary["final_version"] == 3
    assert summary["trainer_device"].startswith("cuda") and summary["trainer_gpus"] == 0.5
    model = load_causal_lm(RunPaths.of(cfg).checkpoint_dir / "step_3" / "model")
    assert next(model.parameters()).device.type == "cpu"
