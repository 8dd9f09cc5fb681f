"""``shapeplan serve --reasoning-parser think``: a thinking model's ``<think> ... </think>`` apart from its answer,
as vLLM's reasoning parsers return it (``message.reasoning_content`` beside ``message.content`` on
``/v1/chat/completions``, ``delta.reasoning_content`` in a stream).

The answer is in its reasoning from the start when it begins with ``<think>`` (Qwen3) or when the rendered
prompt ends with ``<think>`` (DeepSeek-R1's template opens it for the model); the reasoning ends at the first
``</think>`` and the rest, as generated, is the content. An answer with neither is all content. Both tags are
plain text here (in these vocabularies they are single tokens that decode to it).
"""
from __future__ import annotations

OPEN, CLOSE = "<think>", "</think>"


def split(text: str, inside: bool = False) -> tuple[str | None, str]:
    """(the reasoning, or None when the answer has none; the content) of a whole answer. ``inside``: the prompt
    opened the reasoning."""
    if not inside and text.startswith(OPEN):
        inside, text = True, text[len(OPEN):]
    if not inside:
        return None, text
    i = text.find(CLOSE)
    return (text, "") if i < 0 else (text[:i], text[i + len(CLOSE):])


def opens_reasoning(prompt_tail: str) -> bool:
    """Whether a rendered prompt (its last characters) leaves the model inside ``<think>``."""
    return prompt_tail.rstrip().endswith(OPEN)


class ReasoningStream:
    """``split`` of a growing answer as deltas: ``push`` returns (new reasoning, new content). Text that may
    still turn into a tag is held back until it does or cannot (the start while it is a prefix of ``<think>``;
    the reasoning's end while it is a prefix of ``</think>``), so the deltas joined are ``split`` of the whole."""

    __slots__ = ("inside", "text", "sent_r", "sent_c")

    def __init__(self, inside: bool = False) -> None:
        self.inside, self.text, self.sent_r, self.sent_c = inside, "", 0, 0

    def push(self, delta: str, final: bool = False) -> tuple[str, str]:
        self.text += delta
        if not final and not self.inside and len(self.text) < len(OPEN) and OPEN.startswith(self.text):
            return "", ""                                  # may still become <think>
        r, c = split(self.text, self.inside)
        r = r or ""
        keep = len(r)
        if not final and not c and CLOSE not in self.text:
            keep -= _partial(r, CLOSE)                     # a tail that may start </think>
        out = r[self.sent_r:keep], c[self.sent_c:]
        self.sent_r, self.sent_c = max(self.sent_r, keep), len(c)
        return out


def _partial(text: str, tag: str) -> int:
    """The length of the longest tail of ``text`` that is a proper prefix of ``tag``."""
    for n in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0
