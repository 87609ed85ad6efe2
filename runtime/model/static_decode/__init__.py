"""A fixed-shape, host-sync-free decode step of the whole model (for CUDA graphs).

`Model.forward` on one token is not capturable: the KV cache grows, the window is concatenated,
compressor state changes shape, the indexer's k depends on the context, Python branches on counts.
Here every buffer has its final shape from the start and the position is a device tensor, so one
token's step has the same ops and shapes at every position; load/store convert from/to the dynamic
KvCache on the host, so sessions (prefill, truncate, fork) keep working around static decoding.

Module map:
    segments.py    runs of consecutive layers per device (one graph each)
    state.py       static per-layer buffers, load/store from/to a KvCache, the max_context limit
    compressor.py  compressor step: slot writes, provisional entry rows
    indexer.py     fixed-k top-k over all index rows
    attention.py   window ring, HCA over all rows, CSA over the picked rows
    moe.py         routing into static buffers, the executor's decode_step
    step.py        StaticStep: segments, host API
"""

from .step import StaticStep

__all__ = ["StaticStep"]
