"""Token ids -> text as they arrive, without ever printing half a character.

A byte-level tokenizer (``bytes``, GPT-2's BPE) can end a token in the middle of a UTF-8 character; decoding then
gives U+FFFD for the incomplete tail, and the right character once the next token completes it. `TextStream` decodes
everything received so far and releases only the text that can no longer change: it holds back a trailing U+FFFD
until more ids arrive or the stream ends (then a byte sequence that stayed invalid is shown as U+FFFD).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

REPLACEMENT = "\ufffd"


class TextStream:
    """Incremental decoding of one sequence of token ids.

    Args:
        decode: ids -> text (e.g. ``Tokenizer.decode``); must decode a concatenation as the concatenation of bytes.
    """

    def __init__(self, decode: Callable[[list[int]], str]) -> None:
        self.decode = decode
        self.ids: list[int] = []
        self.emitted = 0  # characters of decode(ids) already returned

    def push(self, ids: Iterable[int]) -> str:
        """Add ids; the text that became final (possibly empty)."""
        self.ids.extend(int(i) for i in ids)
        text = self.decode(self.ids)
        end = len(text)
        while end > self.emitted and text[end - 1] == REPLACEMENT:  # maybe an incomplete character: wait
            end -= 1
        out, self.emitted = text[self.emitted : end], max(self.emitted, end)
        return out

    def flush(self) -> str:
        """The rest of the text (the stream has ended: an incomplete tail is final as U+FFFD)."""
        text = self.decode(self.ids)
        out, self.emitted = text[self.emitted :], len(text)
        return out
