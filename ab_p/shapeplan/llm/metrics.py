"""Generation metrics: time to first token and four throughputs.

Token 0 comes from prefill; decode step i produces token i. Windows (tokens / seconds):
overall = all tokens from the request start; decode = steps >= 1 (from token 0's arrival);
steady = steps >= 3 (from token 2's arrival); late_steady = steps >= 20 (from token 19's arrival;
0 for shorter runs). The pipeline syncs with the device at tokens 0, 2 and 19, so these
boundary times are exact, not interpolated.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(slots=True)
class Metrics:
    prompt_tokens: int = 0            # tokens prefilled by this request
    cached_tokens: int = 0            # context tokens whose K/V were already in the cache (sessions, prefix cache)
    new_tokens: int = 0
    ttft_s: float = 0.0
    total_s: float = 0.0
    overall_tok_s: float = 0.0
    decode_tok_s: float = 0.0
    steady_tok_s: float = 0.0
    late_steady_tok_s: float = 0.0
    host_syncs: int = 0
    prefill_bucket: int = 0

    @property
    def effective_tok_s(self) -> float:
        """The most steady-state figure available: late_steady, then steady, decode, overall."""
        for v in (self.late_steady_tok_s, self.steady_tok_s, self.decode_tok_s, self.overall_tok_s):
            if v > 0:
                return v
        return 0.0

    def to_dict(self) -> dict:
        d = asdict(self)
        d["effective_tok_s"] = self.effective_tok_s
        return d


def compute(start: float, token_times: dict[int, float], end: float, n_tokens: int, **kw) -> Metrics:
    """``token_times[i]``: when token i was known to be done (at a host sync); ``end``: last token's."""
    m = Metrics(new_tokens=n_tokens, total_s=end - start, **kw)
    if n_tokens == 0:
        return m
    m.ttft_s = token_times.get(0, end) - start
    m.overall_tok_s = _rate(n_tokens, end - start)

    def window(first_step: int) -> float:
        t0 = token_times.get(first_step - 1)
        return _rate(n_tokens - first_step, end - t0) if t0 is not None and n_tokens > first_step else 0.0

    m.decode_tok_s = window(1)
    m.steady_tok_s = window(3)
    m.late_steady_tok_s = window(20)
    return m


def _rate(n: int, seconds: float) -> float:
    return n / seconds if n > 0 and seconds > 0 else 0.0
