"""EMULATION: the cost curves an emulated engine replays (``explorer.emulated.curve``;
``trinity_like.explorer.engines.emulated``), here so that the config's checks can name them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CostCurve:
    """What one emulated engine's work costs, in seconds."""

    name: str
    iter_floor_s: float
    """One decode iteration at any batch size (reading the weights once)."""
    iter_per_seq_s: float
    """Each active sequence's share of an iteration (its matmuls and KV-cache reads)."""
    prefill_s_per_token: float
    """Prefill of one token of a request joining the batch."""
    load_s: float
    """A weight load (nothing decodes meanwhile)."""
    max_seqs: int
    """Slots: requests decoded at once (vLLM's ``max_num_seqs``)."""

    def iteration_s(self, active: int, prefill_tokens: int = 0) -> float:
        return self.iter_floor_s + active * self.iter_per_seq_s + prefill_tokens * self.prefill_s_per_token


CURVES = {
    "7b_h100": CostCurve("7b_h100", iter_floor_s=5.9e-3, iter_per_seq_s=87e-6, prefill_s_per_token=2.57e-5,
                         load_s=0.67, max_seqs=256),
}
"""Named curves. ``7b_h100``: bench/simulate.py's projection for Qwen2.5-7B's shape on one H100 SXM (decode floor =
15.2 GB of bf16 weights / (3.35 TB/s x 0.77); 87 us per sequence; prefill 2 x 7.62e9 FLOP per token at 60% of 989
TFLOP/s = 25.7 us, 13 ms for a 512-token prompt; a 15.2 GB broadcast load 0.67 s; vLLM's 256 slots)."""
