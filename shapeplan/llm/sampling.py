"""Sampling settings. The draw itself runs on the device inside the plan (ops/llm.py SampleToken)."""
from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from shapeplan.errors import InputError

if TYPE_CHECKING:
    from shapeplan.llm.constraint import Constraint


@dataclass(slots=True, frozen=True)
class Sampling:
    temperature: float = 0.0          # 0 = greedy
    top_k: int = 0                    # 0 = off
    top_p: float = 1.0                # 1 = off
    repetition_penalty: float = 1.0   # 1 = off
    seed: int | None = None           # None = a fresh random seed per request
    stop: tuple[str, ...] = field(default=())   # stop strings (checked at host syncs)
    constraint: "Constraint | None" = None      # structured output (shapeplan/llm/constraint.py)

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise InputError(f"sampling temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise InputError(f"sampling top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise InputError(f"sampling top_k must be >= 0, got {self.top_k}")
        if self.repetition_penalty <= 0:
            raise InputError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")

    @classmethod
    def greedy(cls, **kw) -> "Sampling":
        return cls(temperature=0.0, **kw)

    @classmethod
    def random(cls, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
               repetition_penalty: float = 1.0, seed: int | None = None, **kw) -> "Sampling":
        return cls(temperature, top_k, top_p, repetition_penalty, seed, **kw)

    @property
    def is_plain_greedy(self) -> bool:
        """Greedy without a penalty: the cheap ArgMax output serves it."""
        return self.temperature == 0 and self.repetition_penalty == 1.0

    def resolved_seed(self) -> int:
        return self.seed if self.seed is not None else secrets.randbits(31)

    def as_row(self) -> list[float]:
        return [float(self.temperature), float(self.top_k), float(self.top_p), float(self.repetition_penalty)]
