"""Text from users, tools and the system prompt is data: it is tokenized without control tokens.

A tokenizer maps every occurrence of a special-token string to its control id, wherever the string
came from. A tool output holding `<｜User｜>` or `<｜DSML｜tool_calls>` would then forge a turn
boundary or a tool call. `encode_parts` tokenizes a rendering given as (text, is_data) parts so that
only the structural parts' control tokens are control ids:

1. the whole text is encoded as one string, exactly as before (the common case: no control token
   touches data, and the ids are those of the plain rendering, so the prefix cache and the model's
   training format are unchanged);
2. a segment whose encoding has a control token overlapping data is cut strictly inside that token
   (before its last character when the token lies inside the data, at the data's edge when it spans
   structure and data), and the pieces are encoded again, until no control token touches data.

Encoding goes through encode_batch, which releases the GIL: the server calls this off the event loop.
"""

from __future__ import annotations

_CONTROL: dict[int, tuple[object, frozenset[int]]] = {}  # id(tokenizer) -> (tokenizer kept alive, its ids)


def control_ids(tokenizer) -> frozenset[int]:
    """The ids of the tokenizer's added tokens: the strings it matches before the model (BPE) sees text."""
    got = _CONTROL.get(id(tokenizer))
    if got is None or got[0] is not tokenizer:
        got = _CONTROL[id(tokenizer)] = (tokenizer, frozenset(tokenizer.get_added_tokens_decoder()))
    return got[1]


def _cut(start: int, end: int, data: list[tuple[int, int]]) -> int | None:
    """Where to split the control token at text[start:end] so that it is not matched, or None when it
    touches no data (structure) or cannot be split (a one-character token)."""
    span = next(((a, b) for a, b in data if a < end and start < b), None)
    if span is None or end - start < 2:
        return None
    a, b = span
    if a <= start and end <= b:
        return end - 1
    return a if start < a else b


def encode_parts(tokenizer, parts: list[tuple[str, bool]]) -> list[int]:
    text, data, pos = [], [], 0
    for piece, is_data in parts:
        if is_data and piece:
            data.append((pos, pos + len(piece)))
        text.append(piece)
        pos += len(piece)
    text = "".join(text)
    control = control_ids(tokenizer)
    segments, done = [(0, len(text))], {}
    while todo := [s for s in segments if s not in done]:
        encodings = tokenizer.encode_batch([text[a:b] for a, b in todo], add_special_tokens=False)
        cuts = {}
        for (a, b), enc in zip(todo, encodings):
            inside = sorted({c for i, (s, e) in zip(enc.ids, enc.offsets) if i in control
                             for c in (_cut(a + s, a + e, data),) if c is not None})
            if inside:
                cuts[(a, b)] = inside
            else:
                done[(a, b)] = enc.ids
        segments = [piece for seg in segments for piece in _split(seg, cuts.get(seg, ()))]
    return [i for seg in segments for i in done[seg]]


def _split(segment: tuple[int, int], cuts) -> list[tuple[int, int]]:
    bounds = [segment[0], *cuts, segment[1]]
    return [(bounds[k], bounds[k + 1]) for k in range(len(bounds) - 1)]
