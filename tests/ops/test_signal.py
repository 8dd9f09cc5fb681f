"""ops/signal.py: DFT/STFT vs numpy.fft, windows and MelWeightMatrix vs the ONNX reference."""
from __future__ import annotations

import numpy as np
import onnx
import pytest

from tests.ops._mathops_util import check, node_model, run_ours

rng = np.random.default_rng(4)
SIG = rng.standard_normal((2, 8, 3)).astype(np.float64)


def _dft(x, attrs, opset, length=None, axis=None):
    inputs = {"x": x, "n": None if length is None else np.array(length, np.int64)}
    if axis is not None:
        inputs["a"] = np.array(axis, np.int64)
    elif length is None:
        inputs.pop("n")
    return run_ours(node_model("DFT", inputs, attrs, opset=opset), inputs)[0]


@pytest.mark.parametrize("opset", [17, 20])
def test_dft_forward_onesided_and_length(opset):
    real = SIG[..., None]                                              # [2, 8, 3, 1]
    axis_kw = {"axis": 1} if opset == 17 else {}
    ax = None if opset == 17 else 1
    y = _dft(real, axis_kw, opset, axis=ax)
    want = np.fft.fft(SIG, axis=1)
    np.testing.assert_allclose(y[..., 0] + 1j * y[..., 1], want, atol=1e-9)
    y = _dft(real, {**axis_kw, "onesided": 1}, opset, axis=ax)
    np.testing.assert_allclose(y[..., 0] + 1j * y[..., 1], np.fft.rfft(SIG, axis=1), atol=1e-9)
    y = _dft(real, axis_kw, opset, length=5, axis=ax)
    np.testing.assert_allclose(y[..., 0] + 1j * y[..., 1], np.fft.fft(SIG, n=5, axis=1), atol=1e-9)


def test_dft_inverse_complex_and_irfft():
    z = rng.standard_normal((2, 6)) + 1j * rng.standard_normal((2, 6))
    x = np.stack([z.real, z.imag], -1)
    y = _dft(x, {"inverse": 1}, 20, axis=-2)
    np.testing.assert_allclose(y[..., 0] + 1j * y[..., 1], np.fft.ifft(z, axis=-1), atol=1e-9)
    half = np.fft.rfft(rng.standard_normal((2, 10)), axis=-1)
    xh = np.stack([half.real, half.imag], -1)
    y = _dft(xh, {"inverse": 1, "onesided": 1}, 20, axis=-2)
    np.testing.assert_allclose(y[..., 0], np.fft.irfft(half, axis=-1), atol=1e-9)


@pytest.mark.parametrize("onesided", [0, 1])
def test_stft_matches_reference(onesided):
    sig = rng.standard_normal((2, 40, 1)).astype(np.float32)
    win = np.hanning(10).astype(np.float32)
    check("STFT", {"s": sig, "step": np.array(4, np.int64), "w": win, "n": np.array(10, np.int64)},
          {"onesided": onesided}, opset=17, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("op", ["HannWindow", "HammingWindow", "BlackmanWindow"])
@pytest.mark.parametrize("periodic", [0, 1])
def test_windows(op, periodic):
    check(op, {"n": np.array(10, np.int64)}, {"periodic": periodic}, opset=17, atol=1e-6)
    check(op, {"n": np.array(7, np.int32)}, {"periodic": periodic, "output_datatype": onnx.TensorProto.DOUBLE},
          opset=17, atol=1e-9)


def test_mel_weight_matrix():
    check("MelWeightMatrix", {"m": np.array(8, np.int64), "d": np.array(64, np.int64),
                              "r": np.array(8000, np.int64), "lo": np.float32(20), "hi": np.float32(3800)},
          opset=17)
