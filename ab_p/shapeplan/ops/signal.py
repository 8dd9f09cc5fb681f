"""Signal processing: DFT (opset 17 and 20), STFT, Hann/Hamming/Blackman windows, MelWeightMatrix.

ONNX carries complex numbers as a trailing dimension of 2 (real, imaginary); a trailing 1 means a
real signal. Kernels convert to torch complex tensors, call torch.fft, and convert back.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from shapeplan.errors import ExecutionError
from shapeplan.ir.dtypes import dtype as as_dtype
from shapeplan.ops.registry import Trait, register
from shapeplan.ops._common import ints


def _to_complex(x: torch.Tensor) -> torch.Tensor:
    """[..., 1] real or [..., 2] (re, im) -> complex [...]."""
    work = x.to(torch.float64)          # float64 like the ONNX reference: near-zero outputs stay exact
    if x.shape[-1] == 1:
        return work[..., 0]
    if x.shape[-1] == 2:
        return torch.complex(work[..., 0], work[..., 1])
    raise ExecutionError(f"DFT: the last dim must be 1 (real) or 2 (complex), got {x.shape[-1]}")


def _from_complex(c: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return torch.view_as_real(c if c.is_complex() else torch.complex(c, torch.zeros_like(c))).to(dtype)


def _dft(x: torch.Tensor, length: int | None, axis: int, inverse: int, onesided: int) -> torch.Tensor:
    axis = axis % x.dim()
    if axis == x.dim() - 1:
        raise ExecutionError("DFT: axis must not be the trailing (real, imaginary) dim")
    if length is None:
        length = 2 * (x.shape[axis] - 1) if inverse and onesided else x.shape[axis]
    sig = _to_complex(x)
    if inverse:
        if onesided:                                     # one-sided spectrum -> real signal
            return torch.fft.irfft(sig, n=length, dim=axis).unsqueeze(-1).to(x.dtype)
        return _from_complex(torch.fft.ifft(sig, n=length, dim=axis), x.dtype)
    out = torch.fft.fft(sig, n=length, dim=axis)
    if onesided:
        out = out.narrow(axis, 0, out.shape[axis] // 2 + 1)
    return _from_complex(out, x.dtype)


@register("DFT", since=17, host_inputs=(1,))
def dft_v17(x, dft_length=None, *, axis=1, inverse=0, onesided=0):
    """ONNX DFT-17 (axis attribute)."""
    return _dft(x, None if dft_length is None else ints(dft_length)[0], axis, inverse, onesided)


@register("DFT", since=20, host_inputs=(1, 2))
def dft(x, dft_length=None, axis=None, *, inverse=0, onesided=0):
    """ONNX DFT-20 (axis input, default -2)."""
    ax = -2 if axis is None else ints(axis)[0]
    return _dft(x, None if dft_length is None else ints(dft_length)[0], ax, inverse, onesided)


@register("STFT", since=17, host_inputs=(1, 3))
def stft(signal, frame_step, window=None, frame_length=None, *, onesided=1):
    """ONNX STFT: signal [B, L, 1|2] -> [B, frames, bins, 2]; frames = 1 + (L - n) // step."""
    step = ints(frame_step)[0]
    n = ints(frame_length)[0] if frame_length is not None else \
        (window.shape[0] if window is not None else signal.shape[-2])
    n_frames = 1 + (signal.shape[-2] - n) // step
    sig = _to_complex(signal)                                             # [B, L]
    frames = sig.unfold(-1, n, step)[:, :n_frames]                        # [B, F, n]
    if window is not None:
        frames = frames * window.to(frames.real.dtype if frames.is_complex() else frames.dtype)
    spec = torch.fft.fft(frames, n=n, dim=-1)
    if onesided:
        spec = spec[..., : n // 2 + 1]
    return _from_complex(spec, signal.dtype)


# ----------------------------------------------------------------------------- windows
def _window(size: Any, periodic: int, output_datatype: int, terms: tuple[float, ...]) -> torch.Tensor:
    """sum_k terms[k] * cos(2 pi k n / N) * (-1)^k, N = size (periodic) or size - 1."""
    n_pts = ints(size)[0]
    denom = n_pts if periodic else n_pts - 1
    dev = size.device if isinstance(size, torch.Tensor) else None
    n = torch.arange(n_pts, dtype=torch.float64, device=dev)
    y = torch.zeros_like(n)
    for k, a in enumerate(terms):
        y = y + ((-1) ** k) * a * torch.cos(2 * math.pi * k * n / denom) if k else y + a
    return y.to(as_dtype(output_datatype).torch)


_WINDOW = Trait.CREATES_VALUE | Trait.VALUE_DEPENDENT_SHAPE


@register("HannWindow", since=17, traits=_WINDOW)
def hann_window(size, *, periodic=1, output_datatype=1):
    """ONNX HannWindow."""
    return _window(size, periodic, output_datatype, (0.5, 0.5))


@register("HammingWindow", since=17, traits=_WINDOW)
def hamming_window(size, *, periodic=1, output_datatype=1):
    """ONNX HammingWindow (alpha = 25/46)."""
    return _window(size, periodic, output_datatype, (25 / 46, 1 - 25 / 46))


@register("BlackmanWindow", since=17, traits=_WINDOW)
def blackman_window(size, *, periodic=1, output_datatype=1):
    """ONNX BlackmanWindow."""
    return _window(size, periodic, output_datatype, (0.42, 0.5, 0.08))


@register("MelWeightMatrix", since=17, traits=_WINDOW)
def mel_weight_matrix(num_mel_bins, dft_length, sample_rate, lower_edge_hertz, upper_edge_hertz, *,
                      output_datatype=1):
    """ONNX MelWeightMatrix: [dft_length // 2 + 1, num_mel_bins] triangular filters (HTK mel scale)."""
    n_mel, n_fft, rate = ints(num_mel_bins)[0], ints(dft_length)[0], ints(sample_rate)[0]
    lo, hi = float(lower_edge_hertz.reshape(-1)[0]), float(upper_edge_hertz.reshape(-1)[0])
    n_spec = n_fft // 2 + 1
    mel = lambda f: 2595 * np.log1p(f / 700) / np.log(10)  # noqa: E731
    step = (mel(hi) - mel(lo)) / (n_mel + 2)
    hz = 700 * np.expm1((np.arange(n_mel + 2) * step + mel(lo)) / 2595 * np.log(10))
    bins = ((n_fft + 1) * hz // rate).astype(int)
    out = np.zeros((n_spec, n_mel))
    for i in range(n_mel):
        left, center, right = bins[i], bins[i + 1], bins[i + 2]
        if center == left:
            out[center, i] = 1
        else:
            j = np.arange(left, center + 1)
            out[j, i] = (j - left) / (center - left)
        if right > center:
            j = np.arange(center, right)
            out[j, i] = (right - j) / (right - center)
    dev = num_mel_bins.device if isinstance(num_mel_bins, torch.Tensor) else None
    return torch.from_numpy(out).to(device=dev, dtype=as_dtype(output_datatype).torch)
