"""Fingerprints of weights: what the trainer publishes and every engine checks what it received and serves against.

A version's fingerprint is a short hash over each tensor's name, dtype, shape and a checksum of its bytes
(``tensor_fingerprint``). Per-tensor entries combine by name (``combine_fingerprints``), so the data-parallel
writers of a version each fingerprint their own share. Torch is imported only by the functions that take
tensors: the Synchronizer and CheckpointMonitor combine without it.

The checksum (scheme ``s1``) is computed where the tensor lives, with no copy to the host: the tensor's bytes are
read as 64-bit words, and two integers modulo 2**64 are kept, the sum of the words and the sum of each word times
its place. Integer sums do not depend on the order of addition, so a GPU and the CPU give the same value for the
same bytes; any changed word changes the plain sum, and words that changed places (a transposed matrix, two rows
swapped) change the weighted one. It takes a row-sum and a column-sum pass over the words: on this CPU 5.9 GB/s
on two cores against zlib's 3.9 GB/s (bench/sync.py); on an H100 12.6-21 GB/s (0.4-1.9 GB), where the CRC-32
needed a copy of every tensor to the host (about 10 kernel launches a tensor: far from the device's memory
speed still).

Fingerprints made before ``s1`` existed (scheme ``crc``: zlib's CRC-32 of the bytes on the host), as version
manifests of earlier runs hold, are still computed and checked in that scheme: a combined fingerprint says its
scheme (``s1-`` in front; a bare 16-digit one is ``crc``), and ``weights_fingerprint(..., like=published)``
answers in the scheme of the one it is compared with, on whatever device the receiver holds the weights.
"""

from __future__ import annotations

import hashlib
import os
import zlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

SCHEME = "s1"
"""The scheme every new fingerprint is made in, on every device (on this CPU 0.068 s for 0.38 GB against zlib's
0.097 s, bench/sync.py method fingerprint; on a GPU no copy to the host). ``crc`` is only read."""
SCHEMES = ("s1", "crc")
_WIDTH = 4096
_MASK = 2**64 - 1


def _words(t: torch.Tensor) -> tuple[torch.Tensor, bytes]:
    """A tensor's bytes as int64 words (on its device) and the 0-7 bytes left over (on the host)."""
    import torch

    t = t.detach().contiguous()
    if (t.storage_offset() * t.element_size()) % 8:  # a view not on an 8-byte boundary: copy it to one
        t = t.clone()
    raw = t.reshape(-1).view(torch.uint8)
    n = raw.numel() // 8 * 8
    left = bytes(raw[n:].cpu().numpy().tobytes()) if n < raw.numel() else b""  # read only if any
    return raw[:n].view(torch.int64), left


def _sums(words: torch.Tensor) -> torch.Tensor:
    """Modulo 2**64, as two int64 on the words' device (no wait for it): the sum of the words, and the sum of each
    word times its place (from 1). The words are read as rows of ``_WIDTH``: word r * W + c weighs r * W + c + 1,
    so the weighted sum is W * sum(r * row_r) + sum((c + 1) * column_c), from one row-sum and one column-sum pass,
    plus the short tail."""
    import torch

    dev = words.device
    if not words.numel():
        return torch.zeros(2, dtype=torch.int64, device=dev)
    rows = words.numel() // _WIDTH
    body = words[:rows * _WIDTH].view(rows, _WIDTH)
    row_sums, col_sums = body.sum(1), body.sum(0)  # int64 wraps: modulo 2**64
    tail = words[rows * _WIDTH:]
    arange = lambda lo, n: torch.arange(lo, lo + n, dtype=torch.int64, device=dev)  # noqa: E731
    total = row_sums.sum() + tail.sum()
    placed = ((row_sums * arange(0, rows)).sum() * _WIDTH + (col_sums * arange(1, _WIDTH)).sum()
              + (tail * arange(rows * _WIDTH + 1, tail.numel())).sum())
    return torch.stack([total, placed])


def _head(t: torch.Tensor) -> str:
    return f"{str(t.dtype).removeprefix('torch.')}:{'x'.join(map(str, t.shape))}"


def _s1(head: str, sums: list[int], left: bytes) -> str:
    total, placed = (v & _MASK for v in sums)
    return f"{head}:s1-{total:016x}{placed:016x}{left.hex()}"


def _cast(t: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    t = t.detach()
    return t.to(dtype) if dtype is not None and t.dtype != dtype else t


def tensor_fingerprint(t: torch.Tensor, dtype: torch.dtype | None = None, scheme: str = SCHEME) -> str:
    """``dtype:shape:checksum`` of a tensor's bytes, computed where it lives (cast to ``dtype`` first when
    given), in ``scheme``. Scheme ``s1``: ``s1-`` and the two sums (module
    docstring) plus any bytes past the last word; scheme ``crc``: the CRC-32 of the bytes, taken on the host."""
    import torch

    t = _cast(t, dtype)
    if scheme == "crc":
        host = t.to("cpu").contiguous()
        crc = zlib.crc32(memoryview(host.reshape(-1).view(torch.uint8).numpy())) if host.numel() else 0
        return f"{_head(t)}:{crc:08x}"
    if scheme != "s1":
        raise ValueError(f"unknown fingerprint scheme {scheme!r}; known: {', '.join(SCHEMES)}")
    words, left = _words(t)
    return _s1(_head(t), _sums(words).cpu().tolist(), left)


def _device_s1(state_dict: dict[str, torch.Tensor], dtypes: dict[str, torch.dtype]) -> dict[str, str]:
    """Scheme ``s1`` of tensors on an accelerator: every tensor's sums are queued on its device and cross to the
    host together, one wait for the lot (per tensor, a wait and ~10 kernel launches from 8 threads took 0.8 ms:
    3.2 GB/s for a 100M model on an H100, no faster than zlib on the host)."""
    import torch

    names = sorted(state_dict)
    heads, sums, lefts = {}, {}, {}
    for name in names:
        t = _cast(state_dict[name], dtypes.get(name))
        words, lefts[name] = _words(t)
        heads[name], sums[name] = _head(t), _sums(words)
    by_device: dict[torch.device, list[str]] = {}
    for name in names:
        by_device.setdefault(sums[name].device, []).append(name)
    out = {}
    for group in by_device.values():
        values = torch.stack([sums[n] for n in group]).cpu().tolist()
        out.update({n: _s1(heads[n], v, lefts[n]) for n, v in zip(group, values, strict=True)})
    return out


def scheme_of(fingerprint: str) -> str:
    """The scheme of a combined fingerprint or of one tensor's entry (``s1`` or ``crc``)."""
    last = fingerprint.rsplit(":", 1)[-1]
    return "s1" if last.startswith("s1-") else "crc"


def combine_fingerprints(entries: dict[str, str]) -> str:
    """One short hex fingerprint of a set of weights from each tensor's ``tensor_fingerprint`` (by name, so the
    writers of a version may fingerprint their own shares); ``s1-`` in front when made in scheme ``s1``."""
    h = hashlib.blake2b(digest_size=8)
    for name in sorted(entries):
        h.update(f"{name}={entries[name]};".encode())
    schemes = {scheme_of(v) for v in entries.values()}
    return ("s1-" if schemes == {"s1"} else "") + h.hexdigest()


def tensor_fingerprints(state_dict: dict[str, torch.Tensor], dtypes: dict[str, torch.dtype] | None = None,
                        scheme: str = SCHEME, threads: int = 8) -> dict[str, str]:
    """``tensor_fingerprint`` of every tensor, in ``scheme``: on the CPU the large ones in up to ``threads``
    threads, no more than the machine's cores (torch's reductions and zlib release the GIL), those under 1 MiB in
    the calling thread (handing them to threads made the tiny model's 26 tensors 4x slower: 7.4 ms against 1.7);
    on an accelerator queued on the device with one wait (``_device_s1``)."""
    from concurrent.futures import ThreadPoolExecutor

    dtypes = dtypes or {}
    if scheme == "s1" and any(t.device.type != "cpu" for t in state_dict.values()):
        return _device_s1(state_dict, dtypes)
    one = lambda n: tensor_fingerprint(state_dict[n], dtypes.get(n), scheme)  # noqa: E731
    large = [n for n, t in state_dict.items() if t.numel() * t.element_size() >= 2**20]
    out = {n: one(n) for n in state_dict.keys() - set(large)}
    workers = max(1, min(threads, os.cpu_count() or 1, len(large)))
    if workers == 1:
        out.update({n: one(n) for n in large})
    else:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            out.update(zip(large, pool.map(one, large), strict=True))
    return dict(sorted(out.items()))


def received_fingerprint(state_dict: dict[str, torch.Tensor], like: str, checked: str = "") -> str:
    """The fingerprint of weights an engine received, to compare with the published one (``like``): ``checked``,
    what these very tensors were checked against as they were read (``files.load_version``), where it is in
    ``like``'s scheme, rather than a second pass over them; else computed in ``like``'s scheme."""
    if checked and (not like or scheme_of(checked) == scheme_of(like)):
        return checked
    return weights_fingerprint(state_dict, like=like)


def weights_fingerprint(state_dict: dict[str, torch.Tensor], dtypes: dict[str, torch.dtype] | None = None,
                        like: str = "") -> str:
    """The fingerprint of a version: names, dtypes, shapes and a checksum of every tensor's bytes, wherever the
    tensors live. The trainer computes it from what it publishes; an engine from the weights it serves (cast to
    the published ``dtypes``: an engine may hold float32 copies of bfloat16 weights, which cast back exactly),
    in the scheme of the fingerprint it compares with (``like``; ``SCHEME`` when empty). Also what tests
    and ``status`` use to tell versions apart."""
    return combine_fingerprints(tensor_fingerprints(state_dict, dtypes, scheme_of(like) if like else SCHEME))
