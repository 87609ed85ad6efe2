"""The exact bytes of every token id of a byte-level BPE `tokenizers.Tokenizer`.

A byte-level BPE vocabulary (GPT-2's scheme, which DeepSeek-V4's tokenizer and the tiny test tokenizer
both use) spells each byte as one printable character: the printable Latin-1 bytes stand for
themselves and the other 68 bytes (controls, space, DEL, NBSP, soft hyphen) are moved, in byte order,
to U+0100 onwards, so " " is "Ġ" and "\\n" is "Ċ". Mapping a vocabulary string back through that table
gives the token's bytes. Added tokens (`<｜end▁of▁sentence｜>`, `<think>`, `｜DSML｜`, ...) are not
byte-level encoded: their content is the text itself, and they are listed apart as markers.

    tb = token_bytes(tokenizer)          # tb.tokens[i]: bytes of id i; tb.added: the added tokens' ids
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from tokenizers import decoders, models


@lru_cache(maxsize=1)
def byte_decoder() -> dict[str, int]:
    """GPT-2's table, character -> byte: the inverse of the byte -> printable-character map."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = {b: chr(b) for b in printable}
    moved = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + moved)
            moved += 1
    return {c: b for b, c in chars.items()}


@dataclass(frozen=True)
class TokenBytes:
    tokens: tuple[bytes, ...]   # bytes of each id; an added token's content as UTF-8; b"" for an unused id
    added: frozenset[int]       # ids of added tokens (special or not): chat and tool markers, never plain text

    def __len__(self) -> int:
        return len(self.tokens)


def token_bytes(tokenizer) -> TokenBytes:
    """Bytes of every id of a byte-level BPE `tokenizers.Tokenizer` (ids 0 .. get_vocab_size() - 1).

    Raises ValueError for a tokenizer that is not byte-level BPE (its vocabulary strings would not be
    byte-level spellings) or whose vocabulary has a character outside the byte table."""
    if not isinstance(tokenizer.model, models.BPE) or not isinstance(tokenizer.decoder, decoders.ByteLevel):
        raise ValueError(f"not a byte-level BPE tokenizer (model {type(tokenizer.model).__name__}, "
                         f"decoder {type(tokenizer.decoder).__name__})")
    table = byte_decoder()
    added = tokenizer.get_added_tokens_decoder()
    out = [b""] * tokenizer.get_vocab_size(with_added_tokens=True)
    for text, i in tokenizer.get_vocab(with_added_tokens=False).items():
        if i in added:  # DeepSeek's vocabulary lists BOS/EOS/pad too, in plain text: the added token wins
            continue
        try:
            out[i] = bytes(table[c] for c in text)
        except KeyError as e:
            raise ValueError(f"token {i} {text!r} has the character {e.args[0]!r}, which is not in the "
                             f"byte-level table") from None
    for i, tok in added.items():
        out[i] = tok.content.encode("utf-8")
    return TokenBytes(tuple(out), frozenset(added))
