"""Per-token text for the figures, decoded once per token id and session, with a character
split over several byte tokens shown whole."""
from __future__ import annotations

REPLACEMENT = "\ufffd"


class TokenText:
    def __init__(self):
        self._text: dict[int, str] = {}

    def decoder(self, engine):
        """``decode(ids) -> texts`` through ``engine``'s tokenizer, cached here."""
        def decode(ids):
            ids = list(ids)
            missing = [t for t in ids if t not in self._text]
            if missing:
                self._text.update(zip(missing, engine.decode_tokens(missing)))
            return whole_characters(ids, [self._text[t] for t in ids], engine.tokenizer)
        return decode


def whole_characters(ids: list[int], texts: list[str], tokenizer) -> list[str]:
    """Per-token texts where a character split over several byte tokens (é, 漢, an emoji) is
    shown whole, on the token that completes it, instead of as one � per token: each run of
    tokens that decode to � alone is decoded together."""
    out, i = list(texts), 0
    while i < len(ids):
        if REPLACEMENT not in texts[i]:
            i += 1
            continue
        for j in range(i + 1, min(len(ids), i + 8)):     # a UTF-8 character is <= 4 bytes
            joined = tokenizer.decode(ids[i:j + 1])
            if REPLACEMENT not in joined:
                out[i:j + 1] = [""] * (j - i) + [joined]
                i = j
                break
        i += 1
    return out
