"""Incremental detokenization: each step decodes only around the newest token.

Decoding a sequence's whole output every step costs O(length) per step (O(length²) per
request). Instead each sequence keeps two offsets into its output ids, as vLLM's
``detokenize_incrementally`` does: ``prefix`` (where the text already emitted was decoded from)
and ``read`` (the first token not yet emitted). A step decodes ``ids[prefix:read]`` and
``ids[prefix:]``; the difference is the new text. If the new text ends in U+FFFD, the newest
token ends in the middle of a multi-byte character (byte-level BPE splits UTF-8): nothing is
emitted and the next token completes it. The result equals decoding the whole output at once
for byte-level tokenizers (tested on the default model), except that a character still
incomplete when the sequence ends is left out, as vLLM's detokenizer never emits one.
"""
from __future__ import annotations

from dataclasses import dataclass

_INCOMPLETE = "\ufffd"


@dataclass
class DetokState:
    text: str = ""        # everything emitted so far
    prefix: int = 0       # index (into the ids given) the last emitted chunk was decoded from
    read: int = 0         # ids before this index are in ``text`` (start both at the prompt's
                          # length to pass a sequence's whole token list without copying it)

    def copy(self) -> "DetokState":
        return DetokState(self.text, self.prefix, self.read)


def detokenize_step(tokenizer, ids: list[int], state: DetokState) -> str:
    """Advance ``state`` over ``ids`` (from ``state.read`` on); returns the newly emitted text."""
    if tokenizer is None:
        return ""
    before = tokenizer.decode(ids[state.prefix:state.read], skip_special_tokens=True)
    after = tokenizer.decode(ids[state.prefix:], skip_special_tokens=True)
    if len(after) <= len(before) or after.endswith(_INCOMPLETE):
        return ""             # a special token (skipped) or half a character: wait
    new = after[len(before):]
    state.text += new
    state.prefix, state.read = state.read, len(ids)
    return new
