"""Weight fingerprints: what changes them and what does not (worked by hand, against a plain-Python reference of
the sums, and against zlib's CRC-32 for the earlier scheme)."""

import struct
import zlib

import pytest
import torch

from trinity_like.weights.fingerprint import (
    combine_fingerprints,
    scheme_of,
    tensor_fingerprint,
    tensor_fingerprints,
    weights_fingerprint,
)

M = 2**64


def _reference(data: bytes) -> str:
    """Scheme s1 in plain Python over the bytes: the sum of the little-endian 64-bit words, and the sum of each
    word times its place from 1, modulo 2**64; then the bytes past the last whole word."""
    n = len(data) // 8
    words = struct.unpack(f"<{n}q", data[:n * 8])
    total, placed = sum(words) % M, sum((i + 1) * w for i, w in enumerate(words)) % M
    return f"s1-{total:016x}{placed:016x}" + data[n * 8:].hex()


def test_tensor_fingerprint_is_dtype_shape_and_two_sums_of_its_words():
    t = torch.arange(6, dtype=torch.int32).reshape(2, 3)  # words 1 << 32, 2 + (3 << 32), 4 + (5 << 32)
    w = [1 << 32, 2 + (3 << 32), 4 + (5 << 32)]
    assert tensor_fingerprint(t, scheme="s1") == f"int32:2x3:s1-{sum(w):016x}{w[0] + 2 * w[1] + 3 * w[2]:016x}"
    ones = torch.ones(4097, dtype=torch.int64)  # a full row of 4096 words and one more
    assert tensor_fingerprint(ones, scheme="s1") == f"int64:4097:s1-{4097:016x}{4097 * 4098 // 2:016x}"
    three = torch.tensor([1, 2, 3], dtype=torch.uint8)
    assert tensor_fingerprint(three, scheme="s1") == "uint8:3:s1-" + "0" * 32 + "010203"
    assert tensor_fingerprint(torch.empty(0), scheme="s1") == "float32:0:s1-" + "0" * 32


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.uint8, torch.bool])
def test_the_sums_match_a_plain_python_reference(dtype):
    g = torch.Generator().manual_seed(3)
    t = (torch.randn(9001, generator=g) * 1e4).to(dtype)  # 2+ rows of 4096 words, negative words, a ragged tail
    data = t.view(torch.uint8).numpy().tobytes()
    assert tensor_fingerprint(t, scheme="s1") == f"{str(dtype).removeprefix('torch.')}:9001:{_reference(data)}"


def test_a_view_off_an_eight_byte_boundary_and_a_transposed_matrix():
    flat = torch.arange(33, dtype=torch.uint8)
    assert tensor_fingerprint(flat[1:], scheme="s1") == tensor_fingerprint(flat[1:].clone(), scheme="s1")
    m = torch.randn(64, 64)
    rows = m.clone()
    rows[[0, 1]] = rows[[1, 0]]
    for moved in (m.t().contiguous(), rows):  # the same values, other places
        assert tensor_fingerprint(moved, scheme="s1") != tensor_fingerprint(m, scheme="s1")


def test_the_one_wait_path_for_accelerators_gives_what_the_threaded_host_path_gives():
    """``_device_s1`` (taken where tensors sit on a GPU: all sums queued, one copy to the host) run here on CPU
    tensors: the same entries as the per-tensor path, casts and leftover bytes included."""
    from trinity_like.weights.fingerprint import _device_s1

    g = torch.Generator().manual_seed(5)
    sd = {"w": torch.randn(300, 70, generator=g), "odd": torch.randn(4097 * 4 + 3, generator=g).to(torch.bfloat16),
          "ids": torch.arange(5, dtype=torch.uint8), "empty": torch.empty(0)}
    dtypes = {"w": torch.bfloat16}
    assert _device_s1(sd, dtypes) == tensor_fingerprints(sd, dtypes) == {
        k: tensor_fingerprint(v, dtypes.get(k), scheme="s1") for k, v in sd.items()}


def test_the_earlier_scheme_is_still_computed_and_picked_by_what_it_is_compared_with():
    t = torch.arange(6, dtype=torch.int32).reshape(2, 3)
    crc = zlib.crc32(b"".join(int(i).to_bytes(4, "little") for i in range(6)))
    assert tensor_fingerprint(t, scheme="crc") == f"int32:2x3:{crc:08x}"
    assert tensor_fingerprints({"t": t})["t"] == tensor_fingerprint(t, scheme="s1")  # new ones: s1
    sd = {"a": torch.randn(4, 8), "b": torch.randn(16)}
    crc_fp = combine_fingerprints(tensor_fingerprints(sd, scheme="crc"))  # as an earlier run's manifest holds
    s1_fp = weights_fingerprint(sd)
    assert scheme_of(crc_fp) == "crc" and len(crc_fp) == 16 and scheme_of(s1_fp) == "s1" and s1_fp.startswith("s1-")
    assert weights_fingerprint(sd, like=s1_fp) == s1_fp and weights_fingerprint(sd, like=crc_fp) == crc_fp


def test_one_flipped_byte_a_renamed_or_reshaped_tensor_changes_the_fingerprint():
    sd = {"a": torch.randn(4, 8), "b": torch.randn(16)}
    base = weights_fingerprint(sd)
    assert weights_fingerprint({k: v.clone() for k, v in sd.items()}) == base  # bytes, not identity
    flipped = sd["b"].clone()
    flipped.view(torch.uint8)[37] ^= 0x01  # one bit of one byte
    assert weights_fingerprint({**sd, "b": flipped}) != base
    assert weights_fingerprint({"a": sd["a"], "c": sd["b"]}) != base
    assert weights_fingerprint({**sd, "a": sd["a"].reshape(8, 4)}) != base
    assert weights_fingerprint({"a": sd["a"]}) != base


def test_writers_shares_combine_to_the_whole_and_served_float32_casts_back_to_published_bfloat16():
    sd = {f"w{i}": torch.randn(3, 5) for i in range(5)}
    shares = [{k: sd[k] for k in ("w0", "w3")}, {k: sd[k] for k in ("w1", "w2", "w4")}]
    combined = combine_fingerprints({k: v for s in shares for k, v in tensor_fingerprints(s).items()})
    assert combined == weights_fingerprint(sd)
    published = {k: v.to(torch.bfloat16) for k, v in sd.items()}
    served = {k: v.float() for k, v in published.items()}  # an engine holding float32 copies
    assert weights_fingerprint(served) != weights_fingerprint(published)
    assert weights_fingerprint(served, {k: torch.bfloat16 for k in served}) == weights_fingerprint(published)
