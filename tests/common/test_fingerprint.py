"""Weight fingerprints: what changes them and what does not (worked against zlib's CRC-32 and by hand)."""

import zlib

import torch

from trinity_like.common.fingerprint import (
    combine_fingerprints,
    tensor_fingerprint,
    tensor_fingerprints,
    weights_fingerprint,
)


def test_tensor_fingerprint_is_dtype_shape_and_the_crc32_of_its_bytes():
    t = torch.arange(6, dtype=torch.int32).reshape(2, 3)
    crc = zlib.crc32(b"".join(int(i).to_bytes(4, "little") for i in range(6)))
    assert tensor_fingerprint(t) == f"int32:2x3:{crc:08x}"
    assert tensor_fingerprint(torch.empty(0)) == "float32:0:00000000"


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
