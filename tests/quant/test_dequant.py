"""Dequantization (shapeplan/quant/dequant.py) against gguf-py's, bit for bit, for every GGUF type the
kernels run; the load-time INT8/INT4 group types against their definition."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from shapeplan.errors import ModelError
from shapeplan.quant.dequant import dequantize
from shapeplan.quant.formats import GGUF_TYPES, QTYPES, REPACKED, QuantTypeError, QuantWeight, qtype, repack, unrepack

gguf = pytest.importorskip("gguf")

#: byte offsets of each type's float16 fields in a block (random bytes there could be inf / nan)
F16_FIELDS = {"Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0], "Q2_K": [80, 82],
              "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208], "IQ4_NL": [0], "IQ4_XS": [0],
              "INT8_G64": [0], "INT8_G128": [0], "INT4_G64": [0, 2], "INT4_G128": [0, 2],
              "Q4_K_R": [0, 2], "Q8_0_R": [0], "Q6_K_R": [208]}   # our layouts: their GGUF type's, before the repack


def random_blocks(name: str, rows: int, k: int, seed: int = 0) -> torch.Tensor:
    """Random packed bytes of ``name`` (every bit pattern of codes and scales) with finite f16 fields."""
    if name in REPACKED:
        return repack(random_blocks(REPACKED[name][0], rows, k, seed), name)
    q = QTYPES[name]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(rows, q.row_bytes(k)), dtype=np.uint8)
    blocks = raw.reshape(-1, q.type_size)
    for at in F16_FIELDS[name]:
        blocks[:, at:at + 2] = (rng.standard_normal(len(blocks)) * 0.05).astype(np.float16).view(np.uint8).reshape(-1, 2)
    return torch.from_numpy(raw)


def test_every_type_has_f16_fields_listed():
    assert set(F16_FIELDS) == set(QTYPES)


@pytest.mark.parametrize("name", GGUF_TYPES)
def test_equals_gguf_py_bit_for_bit(name):
    packed = random_blocks(name, 6, 512)
    ref = gguf.quants.dequantize(packed.numpy(), gguf.GGMLQuantizationType[name])
    ours = dequantize(packed, name)
    assert ours.dtype == torch.float32 and tuple(ours.shape) == ref.shape == (6, 512)
    np.testing.assert_array_equal(ours.numpy().view(np.uint32), ref.view(np.uint32))


@pytest.mark.parametrize("name", ["INT8_G64", "INT8_G128", "INT4_G64", "INT4_G128"])
def test_group_types_by_definition(name):
    q = QTYPES[name]
    g = q.block
    packed = random_blocks(name, 3, 2 * g)
    b = packed.reshape(-1, q.type_size)
    d = b[:, 0:2].contiguous().view(torch.float16).float()
    if name.startswith("INT8"):
        want = b[:, 2:].contiguous().view(torch.int8).float() * d
    else:
        m = b[:, 2:4].contiguous().view(torch.float16).float()
        codes = torch.cat([b[:, 4:] & 15, b[:, 4:] >> 4], dim=1).float()    # byte j: elements j, j + G/2
        want = d * codes + m
    torch.testing.assert_close(dequantize(packed, name), want.reshape(3, 2 * g), rtol=0, atol=0)


def test_group32_forms_are_q8_0_and_q4_1():
    """INT8_G* / INT4_G* are Q8_0 / Q4_1 with a larger group: same decoders."""
    assert QTYPES["Q8_0"].kind == QTYPES["INT8_G64"].kind == "int8"
    assert QTYPES["Q4_1"].kind == QTYPES["INT4_G64"].kind == "int4"


def test_unknown_type_names_the_tensor():
    with pytest.raises(QuantTypeError, match=r"'blk\.0\.x'.*IQ2_XXS.*supported: F32, F16, BF16, Q4_0"):
        qtype("IQ2_XXS", tensor="blk.0.x")


def test_quant_weight_checks_its_bytes():
    from shapeplan.errors import ModelError
    with pytest.raises(ModelError, match=r"Q4_K weight of shape \[4, 256\] needs uint8 \[4, 144\]"):
        QuantWeight(torch.zeros(4, 100, dtype=torch.uint8), "Q4_K", (4, 256))
    w = QuantWeight(random_blocks("Q4_K", 4, 256), "Q4_K", (4, 256))
    assert w.rows(slice(1, 3)).shape == (2, 256) and w.nbytes == 4 * 144


@pytest.mark.parametrize("name", sorted(REPACKED))
def test_our_layouts_hold_the_gguf_types_bytes(name):
    """Q4_K_R / Q6_K_R / Q8_0_R (a row's code bytes, then its header bytes) hold the same bytes as their
    GGUF type, so they dequantize to the same values, and the repack round-trips; a row of whole blocks
    only."""
    src, runs = REPACKED[name]
    ts = QTYPES[src].type_size
    assert sorted(b for run in runs for b in range(*run)) == list(range(ts))     # every byte, once
    packed = random_blocks(src, 5, 1024, seed=4)
    r = repack(packed, name)
    nb = packed.shape[1] // ts
    assert r.shape == packed.shape and not torch.equal(r, packed)
    at = 0
    for a, z in runs:                                   # run after run: that byte range of every block
        assert torch.equal(r[:, at:at + nb * (z - a)].reshape(5, nb, z - a), packed.reshape(5, nb, ts)[:, :, a:z])
        at += nb * (z - a)
    assert torch.equal(unrepack(r, name), packed)
    assert torch.equal(dequantize(r, name), dequantize(packed, src))
    assert torch.equal(dequantize(r[1:3], name), dequantize(packed[1:3], src))     # rows stay rows
    with pytest.raises(ModelError, match=rf"{src} rows must be uint8 \[\.\.\., {ts} x blocks\]"):
        repack(packed[:, :ts + 1], name)
