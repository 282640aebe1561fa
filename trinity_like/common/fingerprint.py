"""Fingerprints of weights: what the trainer publishes and every engine checks what it received and serves against.

A version's fingerprint is a short hash over each tensor's name, dtype, shape and the CRC-32 of its bytes
(``tensor_fingerprint``), wherever the tensors live (device tensors are copied to the host for the CRC; zlib
runs at ~2.6 GB/s a core here and tensors are done in parallel threads). Per-tensor entries combine by name
(``combine_fingerprints``), so the data-parallel writers of a version each fingerprint their own share. Torch is
imported only by the functions that take tensors: the Synchronizer and CheckpointMonitor combine without it.
"""

from __future__ import annotations

import hashlib
import os
import zlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def tensor_fingerprint(t: torch.Tensor, dtype: torch.dtype | None = None) -> str:
    """``dtype:shape:crc32`` of a tensor's bytes (taken on the host; cast to ``dtype`` first when given)."""
    import torch

    t = t.detach()
    if dtype is not None and t.dtype != dtype:
        t = t.to(dtype)
    host = t.to("cpu").contiguous()
    crc = zlib.crc32(memoryview(host.reshape(-1).view(torch.uint8).numpy())) if host.numel() else 0
    return f"{str(t.dtype).removeprefix('torch.')}:{'x'.join(map(str, t.shape))}:{crc:08x}"


def combine_fingerprints(entries: dict[str, str]) -> str:
    """One short hex fingerprint of a set of weights from each tensor's ``tensor_fingerprint`` (by name, so the
    writers of a version may fingerprint their own shares)."""
    h = hashlib.blake2b(digest_size=8)
    for name in sorted(entries):
        h.update(f"{name}={entries[name]};".encode())
    return h.hexdigest()


def tensor_fingerprints(state_dict: dict[str, torch.Tensor],
                        dtypes: dict[str, torch.dtype] | None = None) -> dict[str, str]:
    """``tensor_fingerprint`` of every tensor, in parallel threads (zlib and device copies release the GIL)."""
    from concurrent.futures import ThreadPoolExecutor

    names = sorted(state_dict)
    dtypes = dtypes or {}
    with ThreadPoolExecutor(max_workers=max(1, min(8, os.cpu_count() or 1, len(names)))) as pool:
        return dict(zip(names, pool.map(lambda n: tensor_fingerprint(state_dict[n], dtypes.get(n)), names),
                        strict=True))


def weights_fingerprint(state_dict: dict[str, torch.Tensor], dtypes: dict[str, torch.dtype] | None = None) -> str:
    """The fingerprint of a version: names, dtypes, shapes and a CRC-32 of every tensor's bytes, wherever the
    tensors live. The trainer computes it from what it publishes; an engine from the weights it serves (cast to
    the published ``dtypes``: an engine may hold float32 copies of bfloat16 weights, which cast back exactly).
    Also what tests and ``status`` use to tell versions apart."""
    return combine_fingerprints(tensor_fingerprints(state_dict, dtypes))
