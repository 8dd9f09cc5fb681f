"""What xgrammar 0.2.9 lets through that JSON or UTF-8 forbid, and the fixes (shapeplan/llm/grammar.py
applies them): a length-bounded JSON string compiles to a character class that admits raw control
characters (``json_strings_fix`` gives such strings an equivalent pattern), and multi-byte characters
are decoded without checking the second byte's range (``Utf8Guard`` masks the tokens that would make an
overlong form or a surrogate). Random-weight models hit both within a few dozen runs."""
from __future__ import annotations

from typing import Any

import numpy as np


#: a JSON string's characters without escapes: anything but '"', '\\' and the control characters
_PLAIN_CHARS = r'[^"\\\x00-\x1f]'
_DATA_KEYS = ("enum", "const", "default", "examples")


def json_strings_fix(schema: Any) -> Any:
    """``schema`` with every string of bounded length (minLength / maxLength, no pattern, format, enum
    or const) given the equivalent ``pattern``: xgrammar 0.2.9 compiles a bounded string to the character
    class ``[^"\\\r\n]``, which lets raw control characters into the string, and JSON forbids them
    (``json.loads`` rejects the text). The pattern keeps the bounds and leaves them out."""
    if isinstance(schema, list):
        return [json_strings_fix(x) for x in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: (v if k in _DATA_KEYS else json_strings_fix(v)) for k, v in schema.items()}
    if out.get("type") == "string" and ("minLength" in out or "maxLength" in out) and \
            not any(k in out for k in ("pattern", "format", "enum", "const")):
        lo, hi = int(out.pop("minLength", 0)), out.pop("maxLength", None)
        out["pattern"] = f"^{_PLAIN_CHARS}{{{lo},{'' if hi is None else int(hi)}}}$"
    return out


class Utf8Guard:
    """What xgrammar 0.2.9 lets through and UTF-8 forbids: it decodes a multi-byte character without
    checking the second byte's range, so an overlong form (E0 80-9F .., F0 80-8F .. ..) or a surrogate
    (ED A0-BF ..) passes wherever the character it decodes to is allowed, and the detokenized text shows
    U+FFFD instead (a JSON string then breaks its maxLength). After a lead byte E0, ED or F0 the next token
    must start in the lead's range, and no token may hold an invalid sequence: two masks ANDed into a
    row's bitmask (``restrict``). A mask that this would empty is left as xgrammar made it."""

    def __init__(self, vocab: list[bytes], vocab_size: int) -> None:
        self.vocab = vocab
        ok = np.ones(vocab_size, bool)
        first = np.full(vocab_size, -1, np.int16)             # a token's leading continuation byte
        for t, b in enumerate(vocab):
            if b and 0x80 <= b[0] < 0xC0:
                first[t] = b[0]
            ok[t] = _valid_inside(b)
        width = -(-vocab_size // 32)

        def pack(keep: Any) -> Any:
            bits = np.zeros(width * 32, np.uint64)
            bits[:vocab_size] = keep
            return (bits.reshape(width, 32) << np.arange(32, dtype=np.uint64)).sum(1).astype(np.uint32).view(np.int32)

        always = pack(ok)
        self.width = width
        self.words = np.flatnonzero(always != -1)            # the few words holding an always-invalid token
        self.always = always[self.words]
        self.after = {lead: pack(ok & ~((first >= lo) & (first <= hi)))
                      for lead, (lo, hi) in {0xE0: (0x80, 0x9F), 0xED: (0xA0, 0xBF), 0xF0: (0x80, 0x8F)}.items()}

    def token_bytes(self, t: int) -> bytes:
        return self.vocab[t] if 0 <= t < len(self.vocab) else b""

    def restrict(self, row: Any, last_byte: int) -> None:
        """AND the guard into ``row`` (int32 [W], CPU), unless that would leave no token."""
        a = row.numpy()
        mask = self.after.get(last_byte)
        if mask is None:                                     # the usual case: a handful of words
            cur = a[self.words]
            new = cur & self.always
            if (new == cur).all():
                return
            left = bool(new.any()) or np.count_nonzero(a) > np.count_nonzero(cur)   # words elsewhere
            if left:
                a[self.words] = new
        else:
            new = a & mask
            left = bool(new.any())
            if left:
                a[:] = new
        if not left:
            from shapeplan import diagnostics
            diagnostics.record("FALLBACK", "UTF-8 guard left a token mask as xgrammar made it (it would empty it)",
                               last_byte=last_byte)


def _valid_inside(b: bytes) -> bool:
    """Whether ``b``'s bytes, after any leading continuation bytes (their lead came in an earlier token),
    are valid UTF-8 up to a sequence the next token may complete."""
    i = 0
    while i < len(b) and 0x80 <= b[i] < 0xC0:
        i += 1
    while i < len(b):
        c = b[i]
        if c < 0x80:
            i += 1
            continue
        if c < 0xC2 or c > 0xF4:
            return False
        need = 1 if c < 0xE0 else 2 if c < 0xF0 else 3
        lo, hi = {0xE0: (0xA0, 0xBF), 0xED: (0x80, 0x9F), 0xF0: (0x90, 0xBF), 0xF4: (0x80, 0x8F)}.get(c, (0x80, 0xBF))
        for k in range(1, need + 1):
            if i + k >= len(b):
                return True                        # incomplete: the next token goes on
            if not (lo if k == 1 else 0x80) <= b[i + k] <= (hi if k == 1 else 0xBF):
                return False
        i += need + 1
    return True
