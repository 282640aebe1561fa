"""The critic for PPO with GAE: the policy's architecture with a scalar value head.

The backbone starts from ``model.path`` (as verl initialises the critic from the actor) and the head from
zero, so the first values are 0 and GAE starts as Monte-Carlo returns. ``compute_values`` returns V(s_t) for
every response position t: the value of the state *before* token t is produced, read at the position that
predicts it (P-1+t), the same alignment as the log-probs.
"""

from __future__ import annotations

import torch
from tensordict import TensorDict
from torch import nn

from trinity_like.common.modeling import load_causal_lm


class ValueModel(nn.Module):
    def __init__(self, model_path: str) -> None:
        super().__init__()
        lm = load_causal_lm(model_path, train=True)
        self.backbone = lm.get_decoder() if hasattr(lm, "get_decoder") else lm.model
        self.head = nn.Linear(lm.config.hidden_size, 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, input_ids, attention_mask, position_ids) -> torch.Tensor:
        hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                               use_cache=False).last_hidden_state  # (B, T, H)
        return self.head(hidden).squeeze(-1).float()  # (B, T)


def compute_values(critic: ValueModel, batch: TensorDict) -> torch.Tensor:
    """V(s_t) (B, R) for the batch's response positions."""
    width_r = batch["responses"].shape[1]
    width_p = batch["input_ids"].shape[1] - width_r
    values = critic(batch["input_ids"], batch["attention_mask"], batch["position_ids"])  # (B, P+R)
    return values[:, width_p - 1:width_p + width_r - 1]
