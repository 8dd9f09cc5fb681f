"""Deterministic mode and TF32.

``SHAPEPLAN_DETERMINISTIC=1`` (or ``configure(deterministic=True)``): TF32 off for matmuls and
convolutions, cuDNN benchmark off, ``torch.use_deterministic_algorithms(True, warn_only=True)`` and a
fixed cuBLAS workspace config, so a replayed plan and slot_by_slot run the same kernels and are
bit-comparable. TF32 is opt-in everywhere: ``SHAPEPLAN_TF32=1`` or ``configure(tf32=True)`` turns it
on (ignored in deterministic mode). The engine calls ``apply()`` once when it is built for CUDA.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from shapeplan import env


@dataclass(slots=True)
class Settings:
    deterministic: bool
    tf32: bool


def settings() -> Settings:
    det = env.get("SHAPEPLAN_DETERMINISTIC")
    return Settings(det, env.get("SHAPEPLAN_TF32") and not det)


def apply(s: Settings | None = None) -> Settings:
    """Set torch's global switches from ``s`` (default: the environment); returns what was applied."""
    s = s or settings()
    if s.deterministic:
        # cuBLAS reads this when its handle is created; later handles honour it
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.deterministic = True
    torch.backends.cuda.matmul.allow_tf32 = s.tf32
    torch.backends.cudnn.allow_tf32 = s.tf32
    try:
        torch.set_float32_matmul_precision("high" if s.tf32 else "highest")
    except (AttributeError, RuntimeError):
        pass
    from shapeplan import diagnostics
    diagnostics.record("COMPILE", "numerics configured", deterministic=s.deterministic, tf32=s.tf32)
    return s


def configure(*, deterministic: bool | None = None, tf32: bool | None = None) -> Settings:
    cur = settings()
    det = cur.deterministic if deterministic is None else deterministic
    return apply(Settings(det, (cur.tf32 if tf32 is None else tf32) and not det))


def state() -> dict[str, object]:
    """The switches as torch has them now (for reports)."""
    return {"deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
            "matmul_tf32": torch.backends.cuda.matmul.allow_tf32,
            "cudnn_tf32": torch.backends.cudnn.allow_tf32,
            "cudnn_benchmark": torch.backends.cudnn.benchmark}


__all__ = ["Settings", "apply", "configure", "settings", "state"]
