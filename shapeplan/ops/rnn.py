"""Recurrent ops: RNN, GRU (incl. linear_before_reset), LSTM (incl. peepholes, input_forget).

All three share one driver: per direction, project the whole input sequence at once
(``X @ W^T + Wb``), then step through time with the recurrent matmul. ``sequence_lens`` masks
steps past each batch entry's length (its state freezes, its Y rows are zero); the reverse
direction walks each entry's own valid prefix backwards. ``layout=1`` means batch-major I/O.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F

from shapeplan.errors import ModelError
from shapeplan.ops.registry import register

# activation name -> (fn(x, alpha, beta), default alpha, default beta)
_ACTS: dict[str, tuple[Callable[..., torch.Tensor], float | None, float | None]] = {
    "relu": (lambda x, a, b: torch.relu(x), None, None),
    "tanh": (lambda x, a, b: torch.tanh(x), None, None),
    "sigmoid": (lambda x, a, b: torch.sigmoid(x), None, None),
    "affine": (lambda x, a, b: a * x + b, 1.0, 0.0),
    "leakyrelu": (lambda x, a, b: F.leaky_relu(x, a), 0.01, None),
    "thresholdedrelu": (lambda x, a, b: torch.where(x > a, x, torch.zeros_like(x)), 1.0, None),
    "scaledtanh": (lambda x, a, b: a * torch.tanh(b * x), 1.0, 1.0),
    "hardsigmoid": (lambda x, a, b: torch.clamp(a * x + b, 0, 1), 0.2, 0.5),
    "elu": (lambda x, a, b: torch.where(x >= 0, x, a * (torch.exp(x) - 1)), 1.0, None),
    "softsign": (lambda x, a, b: x / (1 + x.abs()), None, None),
    "softplus": (lambda x, a, b: F.softplus(x), None, None),
}


def _activations(names: Sequence[str] | None, defaults: Sequence[str], n_dir: int,
                 alphas: Sequence[float] | None, betas: Sequence[float] | None) -> list[list[Callable]]:
    """Per direction, the list of bound activation callables (f, g[, h])."""
    names = list(names) if names else list(defaults) * n_dir
    if len(names) == len(defaults) and n_dir == 2:
        names = names * 2
    alphas, betas = list(alphas or []), list(betas or [])
    bound: list[Callable] = []
    for name in names:
        key = name.lower()
        if key not in _ACTS:
            raise ModelError(f"RNN activation {name!r} is not supported; known: {sorted(_ACTS)}")
        fn, da, db = _ACTS[key]
        a = alphas.pop(0) if da is not None and alphas else da
        b = betas.pop(0) if db is not None and betas else db
        bound.append(lambda x, fn=fn, a=a, b=b: fn(x, a, b))
    k = len(defaults)
    return [bound[i * k:(i + 1) * k] for i in range(n_dir)]


def _run(cell: Callable[..., tuple], x: torch.Tensor, seq_lens: torch.Tensor | None, states: list[torch.Tensor],
         reverse: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Drive ``cell(x_t, *states) -> new states`` over time; return Y [T, B, H] and final states."""
    T = x.shape[0]
    ys: list[torch.Tensor | None] = [None] * T
    if seq_lens is None:
        order = range(T - 1, -1, -1) if reverse else range(T)
        for t in order:
            states = list(cell(x[t], *states))
            ys[t] = states[0]
        return torch.stack(ys), states  # type: ignore[arg-type]
    lens = seq_lens.to(device=x.device, dtype=torch.int64)
    if reverse:                        # reverse each batch entry's valid prefix, run forward, undo
        t_idx = torch.arange(T, device=x.device).unsqueeze(1)          # [T, 1]
        src = torch.where(t_idx < lens, lens - 1 - t_idx, t_idx)        # [T, B]
        x = torch.gather(x, 0, src.unsqueeze(-1).expand_as(x))
    for t in range(T):
        new = cell(x[t], *states)
        live = (t < lens).unsqueeze(-1)                                 # [B, 1]
        states = [torch.where(live, n, s) for n, s in zip(new, states)]
        ys[t] = torch.where(live, new[0], torch.zeros_like(new[0]))
    y = torch.stack(ys)  # type: ignore[arg-type]
    if reverse:
        y = torch.zeros_like(y).scatter_(0, src.unsqueeze(-1).expand_as(y), y)
        y = torch.where((t_idx < lens).unsqueeze(-1), y, torch.zeros_like(y))
    return y, states


def _recurrent(kind: str, x, w, r, b, seq_lens, init_states: list[Any], *, hidden_size: int | None,
               direction: str, layout: int, acts: list[list[Callable]], clip: float | None,
               n_gates: int, extra: Any, n_out: int) -> tuple:
    if layout == 1:
        x = x.transpose(0, 1)                                           # -> [T, B, I]
        init_states = [None if s is None else s.transpose(0, 1) for s in init_states]
    T, B = x.shape[0], x.shape[1]
    n_dir = 2 if direction == "bidirectional" else 1
    H = int(hidden_size) if hidden_size else r.shape[-1]
    if seq_lens is not None and bool((seq_lens.to(torch.int64) >= T).all()):
        seq_lens = None                                                 # nothing to mask
    ys, finals = [], []
    for dnum in range(n_dir):
        reverse = direction == "reverse" or dnum == 1
        wd, rd = w[dnum], r[dnum]                                       # [G*H, I], [G*H, H]
        xw = x @ wd.T                                                   # [T, B, G*H]
        wb = rb = None
        if b is not None:
            wb, rb = b[dnum, :n_gates * H], b[dnum, n_gates * H:]
            if kind != "GRU":
                xw = xw + wb + rb
                rb = None
            else:
                xw = xw + wb
        states = [torch.zeros(B, H, dtype=x.dtype, device=x.device) if s is None else s[dnum]
                  for s in init_states]
        cell = _CELLS[kind](rd, rb, acts[dnum], clip, H, extra, dnum)
        y, st = _run(cell, xw, seq_lens, states, reverse)
        ys.append(y)
        finals.append(st)
    y = torch.stack(ys, 1)                                              # [T, D, B, H]
    outs = [y] + [torch.stack([f[i] for f in finals]) for i in range(len(init_states))]  # [D, B, H]
    if layout == 1:
        outs = [outs[0].permute(2, 0, 1, 3)] + [o.transpose(0, 1) for o in outs[1:]]
    return tuple(outs[:n_out])


def _clipper(clip: float | None) -> Callable[[torch.Tensor], torch.Tensor]:
    if clip is None:
        return lambda t: t
    return lambda t: torch.clamp(t, -clip, clip)


def _rnn_cell(rd, rb, acts, clip, H, extra, dnum):  # noqa: ANN001, ANN202
    f, c = acts[0], _clipper(clip)

    def cell(xw_t, h):  # noqa: ANN001, ANN202
        return (f(c(xw_t + h @ rd.T)),)
    return cell


def _gru_cell(rd, rb, acts, clip, H, linear_before_reset, dnum):  # noqa: ANN001, ANN202
    f, g, c = acts[0], acts[1], _clipper(clip)
    rz_r, rh = rd[:2 * H], rd[2 * H:]
    rb_zr = rb[:2 * H] if rb is not None else 0
    rb_h = rb[2 * H:] if rb is not None else 0

    def cell(xw_t, h):  # noqa: ANN001, ANN202
        zr = f(c(xw_t[:, :2 * H] + h @ rz_r.T + rb_zr))
        z, rr = zr[:, :H], zr[:, H:]
        if linear_before_reset:
            hh = g(c(xw_t[:, 2 * H:] + rr * (h @ rh.T + rb_h)))
        else:
            hh = g(c(xw_t[:, 2 * H:] + (rr * h) @ rh.T + rb_h))
        return ((1 - z) * hh + z * h,)
    return cell


def _lstm_cell(rd, rb, acts, clip, H, extra, dnum):  # noqa: ANN001, ANN202
    f, g, hf, c = acts[0], acts[1], acts[2], _clipper(clip)
    p, input_forget = extra
    pi = po = pf = None
    if p is not None:
        pi, po, pf = p[dnum, :H], p[dnum, H:2 * H], p[dnum, 2 * H:]

    def cell(xw_t, h, cprev):  # noqa: ANN001, ANN202
        gates = xw_t + h @ rd.T                                         # [B, 4H]: i, o, f, c
        gi, go, gf, gc = gates[:, :H], gates[:, H:2 * H], gates[:, 2 * H:3 * H], gates[:, 3 * H:]
        i = f(c(gi + pi * cprev if pi is not None else gi))
        fg = 1 - i if input_forget else f(c(gf + pf * cprev if pf is not None else gf))
        ct = fg * cprev + i * g(c(gc))
        o = f(c(go + po * ct if po is not None else go))
        return o * hf(ct), ct
    return cell


_CELLS = {"RNN": _rnn_cell, "GRU": _gru_cell, "LSTM": _lstm_cell}


def _n_dir(direction: str) -> int:
    return 2 if direction == "bidirectional" else 1


@register("RNN", since=1)
def rnn(x, w, r, b=None, sequence_lens=None, initial_h=None, *, activation_alpha=None,
        activation_beta=None, activations=None, clip=None, direction="forward", hidden_size=None,
        layout=0, output_sequence=0, _n_out=2):
    """ONNX RNN: H_t = f(X_t W^T + H_{t-1} R^T + Wb + Rb)."""
    acts = _activations(activations, ["Tanh"], _n_dir(direction), activation_alpha, activation_beta)
    return _recurrent("RNN", x, w, r, b, sequence_lens, [initial_h], hidden_size=hidden_size,
                      direction=direction, layout=layout, acts=acts, clip=clip, n_gates=1, extra=None,
                      n_out=_n_out)


@register("GRU", since=1)
def gru(x, w, r, b=None, sequence_lens=None, initial_h=None, *, activation_alpha=None,
        activation_beta=None, activations=None, clip=None, direction="forward", hidden_size=None,
        layout=0, linear_before_reset=0, output_sequence=0, _n_out=2):
    """ONNX GRU (gate order z, r, h)."""
    acts = _activations(activations, ["Sigmoid", "Tanh"], _n_dir(direction), activation_alpha, activation_beta)
    return _recurrent("GRU", x, w, r, b, sequence_lens, [initial_h], hidden_size=hidden_size,
                      direction=direction, layout=layout, acts=acts, clip=clip, n_gates=3,
                      extra=linear_before_reset, n_out=_n_out)


@register("LSTM", since=1)
def lstm(x, w, r, b=None, sequence_lens=None, initial_h=None, initial_c=None, p=None, *,
         activation_alpha=None, activation_beta=None, activations=None, clip=None, direction="forward",
         hidden_size=None, input_forget=0, layout=0, output_sequence=0, _n_out=3):
    """ONNX LSTM (gate order i, o, f, c; peepholes P = [Pi, Po, Pf])."""
    acts = _activations(activations, ["Sigmoid", "Tanh", "Tanh"], _n_dir(direction), activation_alpha,
                        activation_beta)
    return _recurrent("LSTM", x, w, r, b, sequence_lens, [initial_h, initial_c], hidden_size=hidden_size,
                      direction=direction, layout=layout, acts=acts, clip=clip, n_gates=4,
                      extra=(p, input_forget), n_out=_n_out)
