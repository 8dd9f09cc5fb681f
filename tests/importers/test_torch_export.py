"""torch.export importer: exported modules run in shapeplan and match eager torch."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import shapeplan as sp
from shapeplan.importers.torch_export import load_exported, supported_aten_ops

MODES = ["slot_by_slot", "auto"]


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(12, 32), nn.Linear(32, 32), nn.Linear(32, 5)

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        h = F.silu(self.fc2(h)) + torch.tanh(h) * 0.5 - torch.sigmoid(h) / 3
        return torch.softmax(self.fc3(h), dim=-1)


class ConvNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.conv2, self.bn2 = nn.Conv2d(8, 16, 3, stride=1, padding=1, bias=False), nn.BatchNorm2d(16)
        self.pool, self.head = nn.AdaptiveAvgPool2d(1), nn.Linear(16, 4)
        for bn in (self.bn1, self.bn2):                    # non-trivial running stats
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)

    def forward(self, x):                                  # [B, 3, 16, 16]
        x = F.max_pool2d(torch.relu(self.bn1(self.conv1(x))), 2)
        x = F.avg_pool2d(torch.relu(self.bn2(self.conv2(x))), 2)
        return self.head(self.pool(x).flatten(1))


class Block(nn.Module):
    """Pre-LN transformer block: nn.MultiheadAttention, then causal F.scaled_dot_product_attention."""

    def __init__(self, d: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2, self.ln3 = nn.LayerNorm(d), nn.LayerNorm(d), nn.LayerNorm(d)
        self.mha = nn.MultiheadAttention(d, heads, batch_first=True)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.up, self.down = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):                                  # [B, T, D]
        h = self.ln1(x)
        x = x + self.mha(h, h, h, need_weights=False)[0]
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln2(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))   # [B, H, T, Dh]
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.down(F.gelu(self.up(self.ln3(x))))


class Misc(nn.Module):
    """embedding, cat/slice/select, masked_fill/where, reductions, rsqrt/pow/exp/log, arange, expand, casts."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(20, 8)
        self.register_buffer("scale", torch.linspace(0.5, 1.5, 8))

    def forward(self, ids, x):                             # ids [B, T] int64, x [B, T, 8]
        e = self.emb(ids) * self.scale
        y = torch.cat([e, x], dim=-1)[:, 1:, 2:10]         # [B, T-1, 8]
        y = y.masked_fill(y > 1.0, 1.0)
        y = torch.where(y < -1.0, torch.zeros_like(y), y)
        r = torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + 1e-6)
        pos = torch.arange(y.shape[1], dtype=torch.float32).unsqueeze(-1).expand(-1, 8)   # [T-1, 8]
        z = y * r + torch.exp(-pos) + torch.log(y.abs() + 1.0)
        z = F.log_softmax(z, dim=-1) + z.amax(dim=1, keepdim=True) + z.sum(dim=(0, 2), keepdim=True)
        return z[:, 0], z.to(torch.float64)


def _check(module, args, feeds, ep=None, atol=1e-5):
    module.eval()
    with torch.no_grad():
        want = module(*args)
    want = list(want) if isinstance(want, (tuple, list)) else [want]
    graph = load_exported(ep or torch.export.export(module, args))     # decomposing is the slow part: once
    for mode in MODES:
        got = list(sp.compile(graph.copy(), mode=mode).run(feeds).values())
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and g.shape == w.shape, (mode, g.dtype, g.shape, w.dtype, w.shape)
            torch.testing.assert_close(g, w, atol=atol, rtol=1e-5, msg=lambda m: f"{mode}: {m}")


def test_mlp():
    torch.manual_seed(0)
    x = torch.randn(4, 12)
    _check(MLP(), (x,), {"x": x})


def test_conv_bn_pool():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 16, 16)
    _check(ConvNet(), (x,), {"x": x})


def test_transformer_block():
    torch.manual_seed(0)
    x = torch.randn(2, 7, 32)
    m = Block().eval()
    _check(m, (x,), {"x": x})
    ops = sp.load(torch.export.export(m, (x,))).op_histogram()
    assert ops["Attention"] == 2 and ops["LayerNormalization"] == 3 and ops["Gelu"] == 1


def test_misc_ops():
    torch.manual_seed(0)
    ids, x = torch.randint(0, 20, (2, 6)), torch.randn(2, 6, 8) * 2
    _check(Misc(), (ids, x), {"ids": ids, "x": x})


def test_dynamic_batch():
    torch.manual_seed(0)
    m = Block().eval()
    batch = torch.export.Dim("batch", min=1, max=64)
    ep = torch.export.export(m, (torch.randn(2, 7, 32),), dynamic_shapes=({0: batch},))
    g = load_exported(ep)
    (x_in,) = g.inputs
    assert isinstance(x_in.shape[0], str) and x_in.shape[1:] == (7, 32)      # named after the symbol
    for mode in MODES:
        engine = sp.compile(ep if mode == "auto" else g.copy(), mode=mode)   # sp.compile(ep) path once
        for b in (3, 5, 3):
            x = torch.randn(b, 7, 32)
            with torch.no_grad():
                want = m(x)
            (got,) = engine.run({"x": x}).values()
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_unsupported_op_names_op_node_and_table():
    class Cum(nn.Module):
        def forward(self, x):
            return torch.cumsum(x, dim=0) + 1

    ep = torch.export.export(Cum(), (torch.randn(3),))
    with pytest.raises(sp.UnsupportedOpError) as err:
        sp.load(ep)
    msg = str(err.value)
    assert "aten.cumsum" in msg and "'cumsum'" in msg and "aten.addmm.default" in msg
    assert "aten.addmm.default" in supported_aten_ops()


def test_mutated_buffer_is_a_clear_error():
    class Counter(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("n", torch.zeros(1))

        def forward(self, x):
            self.n.add_(1)
            return x + self.n

    ep = torch.export.export(Counter(), (torch.randn(2),))
    with pytest.raises(sp.ModelError, match="mutates"):
        sp.load(ep)
