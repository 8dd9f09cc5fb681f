"""ai.onnx.preview.training optimizers: Adagrad, Momentum (standard and Nesterov), Adam.

Inputs are (R, T, X_1..X_n, G_1..G_n, state...) with R the learning rate and T the step count
(scalars); outputs are the new X_1..X_n then the new states, as in the ONNX reference.
"""
from __future__ import annotations

import torch

from shapeplan.errors import ModelError
from shapeplan.ops.registry import register

DOMAIN = "ai.onnx.preview.training"


def _groups(name: str, xs: tuple, n_groups: int) -> tuple[torch.Tensor, int, list[list[torch.Tensor]]]:
    r, t, rest = xs[0], xs[1], xs[2:]
    if len(rest) % n_groups:
        raise ModelError(f"{name}: expected 2 + {n_groups}*n inputs (R, T, then {n_groups} groups of n "
                         f"tensors), got {len(xs)}")
    n = len(rest) // n_groups
    return r, int(t.reshape(-1)[0]), [list(rest[i * n:(i + 1) * n]) for i in range(n_groups)]


@register("Adagrad", domain=DOMAIN, since=1)
def adagrad(*xs, decay_factor=0.0, epsilon=0.0, norm_coefficient=0.0):
    """X_new = X - R / (1 + T*decay) * G' / (sqrt(H + G'^2) + eps), G' = G + norm_coefficient*X."""
    r, t, (X, G, H) = _groups("Adagrad", xs, 3)
    r_ = r / (1 + t * decay_factor)
    x_out, h_out = [], []
    for x, g, h in zip(X, G, H):
        g_reg = norm_coefficient * x + g
        h_new = h + g_reg * g_reg
        x_out.append((x - r_ * g_reg / (torch.sqrt(h_new) + epsilon)).to(x.dtype))
        h_out.append(h_new.to(h.dtype))
    return tuple(x_out + h_out)


@register("Momentum", domain=DOMAIN, since=1)
def momentum(*xs, alpha, beta, mode, norm_coefficient):
    """SG with momentum; ``mode`` "standard" or "nesterov"; beta is 1 at the first step (T = 0)."""
    r, t, (X, G, V) = _groups("Momentum", xs, 3)
    if mode not in ("standard", "nesterov"):
        raise ModelError(f"Momentum: mode must be 'standard' or 'nesterov', got {mode!r}")
    beta_adj = beta if t > 0 else 1.0
    x_out, v_out = [], []
    for x, g, v in zip(X, G, V):
        g_reg = norm_coefficient * x + g
        v_new = alpha * v + beta_adj * g_reg
        step = v_new if mode == "standard" else g_reg + alpha * v_new
        x_out.append((x - r * step).to(x.dtype))
        v_out.append(v_new.to(v.dtype))
    return tuple(x_out + v_out)


@register("Adam", domain=DOMAIN, since=1)
def adam(*xs, alpha=0.9, beta=0.999, epsilon=1e-6, norm_coefficient=0.0, norm_coefficient_post=0.0):
    """Adam with bias correction from the second step (T > 0), optional pre/post L2 terms."""
    r, t, (X, G, V, H) = _groups("Adam", xs, 4)
    r_adj = r * (1 - beta ** t) ** 0.5 / (1 - alpha ** t) if t > 0 else r
    x_out, v_out, h_out = [], [], []
    for x, g, v, h in zip(X, G, V, H):
        g_reg = norm_coefficient * x + g
        v_new = alpha * v + (1 - alpha) * g_reg
        h_new = beta * h + (1 - beta) * (g_reg * g_reg)
        x_new = x - r_adj * (v_new / (torch.sqrt(h_new) + epsilon))
        x_out.append(((1 - norm_coefficient_post) * x_new).to(x.dtype))
        v_out.append(v_new.to(v.dtype))
        h_out.append(h_new.to(h.dtype))
    return tuple(x_out + v_out + h_out)
