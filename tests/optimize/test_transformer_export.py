"""Llama / BERT blocks exported with torch.onnx.export (dynamo, random weights): the fusions fire
once per layer and outputs match the unoptimized graph. Slow (export takes ~1 min each)."""
import collections

import numpy as np
import pytest

import shapeplan as sp
from shapeplan.optimize import optimize_with_report

from tests.optimize.util import need

pytestmark = pytest.mark.slow
LAYERS = 2


def _export(kind: str, path: str) -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("onnxscript")
    tr = pytest.importorskip("transformers")
    torch.manual_seed(0)
    if kind == "llama":
        cfg = tr.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=LAYERS,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
        m = tr.LlamaModel(cfg).eval()
    else:
        cfg = tr.BertConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=LAYERS,
                            num_attention_heads=4, max_position_embeddings=64)
        m = tr.BertModel(cfg).eval()
        with torch.no_grad():                           # random biases: BERT initialises them to 0
            for p in m.parameters():
                if p.dim() == 1:
                    p.normal_(0, 0.02)

    class W(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.m = m

        def forward(self, ids):
            return self.m(input_ids=ids)[0]

    ids = torch.randint(0, 64, (1, 8))
    torch.onnx.export(W().eval(), (ids,), path, dynamo=True, opset_version=18)


@pytest.mark.parametrize("kind", ["llama", "bert"])
def test_exported_block(kind, tmp_path):
    need("MatMul", "Softmax", "ReduceMean", "Gather")
    path = str(tmp_path / f"{kind}.onnx")
    _export(kind, path)
    g = sp.load(path)
    g2, rep = optimize_with_report(g)
    print(f"\n{kind}: {len(g.nodes)} -> {len(g2.nodes)} nodes\n{rep.to_text()}")
    hist = collections.Counter(n.op_type for n in g2.nodes)
    if rep.applied("AttentionFusion") == 0 and g2.opset("") < 23 and not sp.ops.is_supported("Attention", "shapeplan"):
        pytest.skip("Attention op not in the table yet")
    assert rep.applied("AttentionFusion") == LAYERS and hist["Attention"] == LAYERS
    assert rep.applied("HorizontalFusion") >= LAYERS
    if kind == "llama":
        assert rep.applied("NormalizationFusion") == 2 * LAYERS + 1     # input/post-attn norms + final
    ids = np.random.default_rng(0).integers(0, 64, (1, 8)).astype(np.int64)
    name = g.inputs[0].name
    want = sp.compile(g, optimize=False).run({name: ids})
    got = sp.compile(g2, optimize=False).run({name: ids})
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-4)
