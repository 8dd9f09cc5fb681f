"""The int4 baseline of ``--vs-torch-compile`` (llm/reference_int4.py): torch's tinygemm kernel on our
packing must equal a matmul with the dequantized weight ((q - 8) * scale + zero, gpt-fast's recipe)."""
import pytest
import torch

from shapeplan.llm.reference_int4 import int4_linear

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _dequantized(w: torch.Tensor, group: int) -> torch.Tensor:
    n, k = w.shape
    wf = w.float().reshape(n, k // group, group)
    hi, lo = wf.amax(-1, keepdim=True), wf.amin(-1, keepdim=True)
    scale = (hi - lo).clamp(min=1e-6) / 15
    zero = lo + 8 * scale
    q = ((wf - lo) / scale).round().clamp(0, 15)
    # the kernel reads scale and zero as bfloat16
    return ((q - 8) * scale.bfloat16().float() + zero.bfloat16().float()).reshape(n, k)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n,k,group", [(256, 512, 64), (384, 1024, 128)])
def test_tinygemm_equals_the_dequantized_matmul(device, n, k, group):
    g = torch.Generator().manual_seed(n + k)
    w = torch.randn(n, k, generator=g).to(torch.bfloat16).to(device)
    x = torch.randn(3, k, generator=g).to(torch.bfloat16).to(device)
    y = int4_linear(w, group)(x).float()
    want = x.float() @ _dequantized(w, group).T
    assert ((y - want).norm() / want.norm()).item() < 1e-2          # bf16 accumulation, not packing
    # and the quantization error itself is what 4 bits give (a wrong nibble order gives ~1.4)
    assert ((y - x.float() @ w.float().T).norm() / want.norm()).item() < 0.15
