"""Execution modes (the public ``sp.Mode``)."""
from __future__ import annotations

import enum


class Mode(str, enum.Enum):
    AUTO = "auto"
    SLOT_BY_SLOT = "slot_by_slot"
    EMULATED_REPLAY = "emulated_replay"
    CUDA_GRAPHS = "cuda_graphs"
    TRITON = "triton"
    SHAPE_INFERENCE_ONLY = "shape_inference_only"

    @classmethod
    def parse(cls, value: "str | Mode") -> "Mode":
        if isinstance(value, Mode):
            return value
        try:
            return cls(str(value).lower())
        except ValueError:
            raise ValueError(f"unknown mode {value!r}; choose one of "
                             f"{', '.join(m.value for m in cls)}") from None
