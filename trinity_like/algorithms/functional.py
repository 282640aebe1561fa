"""Masked reductions shared by the estimators and losses.

Conventions (those of verl, so numbers match what users compare with): a masked mean divides by
``mask.sum() + 1e-8``; a masked variance is unbiased (Bessel's correction); whitening is
``(x - mean) * rsqrt(var + 1e-8)``. Masks are float or bool, 1 = the position counts.
"""

from __future__ import annotations

import torch


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """sum(values * mask) over ``dim`` (all dims when None)."""
    prod = values * mask.to(values.dtype)
    return prod.sum() if dim is None else prod.sum(dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """sum(values * mask) / (sum(mask) + 1e-8) over ``dim`` (all dims when None); 0 for an empty mask."""
    mask = mask.to(values.dtype)
    denom = mask.sum() if dim is None else mask.sum(dim)
    return masked_sum(values, mask, dim) / (denom + 1e-8)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of the masked entries; unbiased by default (needs at least two of them)."""
    mask = mask.to(values.dtype)
    mean = masked_mean(values, mask)
    variance = masked_mean((values - mean) ** 2, mask)
    if unbiased:
        n = mask.sum()
        if n < 2:
            raise ValueError(f"an unbiased masked variance needs at least 2 unmasked entries, got {float(n):g}")
        variance = variance * n / (n - 1)
    return variance


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """(values - mean) * rsqrt(var + 1e-8) with mean and unbiased var over the mask; every position is
    transformed (callers zero the masked ones where they need to). ``shift_mean=False`` adds the mean back."""
    mean, var = masked_mean(values, mask), masked_var(values, mask)
    whitened = (values - mean) * torch.rsqrt(var + 1e-8)
    return whitened if shift_mean else whitened + mean
