"""Incremental detokenization (text deltas as tokens arrive) and stop strings: the one implementation for the
server's streams and the engine's outputs (``LLMEngine`` ends a request whose text reaches a stop string)."""

from __future__ import annotations


class Detokenizer:
    """Turns a growing list of token ids into text deltas.

    Decodes a short window of recent tokens and emits only text that is complete: a delta ending in U+FFFD (a
    multi-byte character split across tokens) is held back until the next token completes it. With stop
    strings, text that could still become a stop string is held back too, and ``stopped`` is set when one
    appears (the stop string itself is not emitted, as in OpenAI's API).
    """

    def __init__(self, tokenizer, stop: list[str] | None = None) -> None:
        self.tokenizer = tokenizer
        self.stop = stop or []
        self.holdback = max((len(s) for s in self.stop), default=1) - 1
        self.token_ids: list[int] = []
        self.prefix_offset = 0
        self.read_offset = 0
        self.text = ""  # all text decoded so far
        self.sent = 0  # characters of ``text`` already emitted
        self.stopped = False
        self.stop_reason: str | None = None  # the stop string that ended the text

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def add(self, token_ids: list[int], final: bool = False) -> str:
        """The text delta after appending ``token_ids``; ``final`` flushes everything held back."""
        if self.stopped:
            return ""
        self.token_ids += token_ids
        if self.tokenizer is not None and self.token_ids:
            prefix = self._decode(self.token_ids[self.prefix_offset:self.read_offset])
            full = self._decode(self.token_ids[self.prefix_offset:])
            if len(full) > len(prefix) and (final or not full.endswith("\ufffd")):
                self.text += full[len(prefix):]
                self.prefix_offset, self.read_offset = self.read_offset, len(self.token_ids)
        hits = [(at, s) for s in self.stop if (at := self.text.find(s, max(0, self.sent - len(s) + 1))) != -1]
        if hits:
            at, self.stop_reason = min(hits)
            self.stopped = True
            self.text = self.text[:at]
        end = len(self.text) if final or self.stopped else max(self.sent, len(self.text) - self.holdback)
        delta, self.sent = self.text[self.sent:end], end
        return delta
