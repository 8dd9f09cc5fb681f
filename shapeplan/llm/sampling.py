"""Sampling settings. The draw itself runs on the device inside the plan (ops/llm.py SampleToken)."""
from __future__ import annotations

import math
import numbers
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
    # OpenAI's additive terms, on the logits after the repetition penalty: token j's logit minus
    # frequency_penalty * (times j was generated) minus presence_penalty * (j was generated at all), plus
    # logit_bias[j]; ``logit_bias``: {token id: bias} (a mapping or (id, bias) pairs; kept as sorted pairs)
    presence_penalty: float = 0.0     # 0 = off; -2 to 2
    frequency_penalty: float = 0.0    # 0 = off; -2 to 2
    logit_bias: tuple[tuple[int, float], ...] = field(default=())    # -100 to 100 each
    min_p: float = 0.0                # 0 = off: drop tokens less likely than min_p x the likeliest (after top-p)
    stop_token_ids: tuple[int, ...] = field(default=())    # end the request after any of these (as EOS does)

    def __post_init__(self) -> None:
        for name in ("temperature", "top_p", "repetition_penalty", "min_p", "presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v):
                raise InputError(f"sampling {name} must be a finite number, got {v!r}")
        for name, v in (("top_k", self.top_k), ("seed", self.seed)):
            if (isinstance(v, bool) or not isinstance(v, numbers.Integral)) and not (name == "seed" and v is None):
                raise InputError(f"sampling {name} must be an integer, got {v!r}")
        for name in ("stop", "logit_bias", "stop_token_ids"):           # None: none
            if getattr(self, name) is None:
                object.__setattr__(self, name, ())
        stops = (self.stop,) if isinstance(self.stop, str) else self.stop    # one string: one stop, not its letters
        if not isinstance(stops, (tuple, list)) or not all(isinstance(x, str) for x in stops):
            raise InputError(f"sampling stop must be a string or a list of strings, got {self.stop!r}")
        object.__setattr__(self, "stop", tuple(stops))
        if self.temperature < 0:
            raise InputError(f"sampling temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise InputError(f"sampling top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise InputError(f"sampling top_k must be >= 0, got {self.top_k}")
        if self.repetition_penalty <= 0:
            raise InputError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        if not 0 <= self.min_p <= 1:
            raise InputError(f"sampling min_p must be in [0, 1], got {self.min_p}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2 <= getattr(self, name) <= 2:
                raise InputError(f"{name} must be in [-2, 2], got {getattr(self, name)}")
        bias = self.logit_bias.items() if isinstance(self.logit_bias, dict) else self.logit_bias
        try:
            pairs = tuple(sorted((int(t), float(b)) for t, b in bias))
        except (TypeError, ValueError):
            raise InputError("logit_bias must map token ids to numbers, got "
                             f"{str(self.logit_bias)[:80]}") from None
        for t, b in pairs:
            if t < 0 or not -100 <= b <= 100:
                raise InputError(f"logit_bias: token id {t} with bias {b}: ids are >= 0 and biases in [-100, 100]")
        if len({t for t, _ in pairs}) != len(pairs):
            raise InputError("logit_bias names a token id twice")
        object.__setattr__(self, "logit_bias", pairs)
        try:
            stops = tuple(int(t) for t in self.stop_token_ids)
        except (TypeError, ValueError):
            raise InputError(f"stop_token_ids must be token ids, got {str(self.stop_token_ids)[:80]}") from None
        if any(t < 0 for t in stops):
            raise InputError(f"stop_token_ids must be >= 0, got {list(stops)}")
        object.__setattr__(self, "stop_token_ids", stops)

    @classmethod
    def greedy(cls, **kw) -> "Sampling":
        return cls(temperature=0.0, **kw)

    @classmethod
    def random(cls, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
               repetition_penalty: float = 1.0, seed: int | None = None, **kw) -> "Sampling":
        return cls(temperature, top_k, top_p, repetition_penalty, seed, **kw)

    @property
    def adjusts(self) -> bool:
        """Whether the additive terms (presence / frequency penalty, logit bias) change any logit."""
        return bool(self.presence_penalty or self.frequency_penalty or self.logit_bias)

    @property
    def is_plain_greedy(self) -> bool:
        """Greedy without a penalty or bias: the cheap ArgMax output serves it."""
        return self.temperature == 0 and self.repetition_penalty == 1.0 and not self.adjusts

    def resolved_seed(self) -> int:
        return self.seed if self.seed is not None else secrets.randbits(31)

    def as_row(self) -> list[float]:
        return [float(self.temperature), float(self.top_k), float(self.top_p), float(self.repetition_penalty),
                float(self.min_p)]
