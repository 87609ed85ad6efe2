"""The DeepSeek-V4 forward pass, written from docs/model.md section 3, with session KV caches.

Module map (one concept each):
    rope.py              interleaved RoPE; plain (sliding layers) and YaRN (compressed layers) tables
    norms.py             float32 RMS norms
    hyper_connection.py  mHC: pre (Sinkhorn), post, final head collapse
    compressor.py        CSA/HCA compressor, incremental over windows
    indexer.py           CSA lightning indexer: scores and top-k picks
    attention.py         sliding window + compressed entries + sinks, grouped output
    router.py            sqrt-softplus top-k and hash routing
    experts.py           ExpertExecutor contract and the plain DenseExpertExecutor
    moe.py               router -> executor + shared expert (routing observer hook)
    kv_cache.py          per-layer cache, snapshots of its constant-size state
    loading.py           weights from the checkpoint reader, every tensor claimed
    model.py             Model.forward, load_model
    session.py           Session: prefill, decode, truncate, fork
    static_decode/       fixed-shape, host-sync-free decode step (CUDA-graph capturable)
"""

from .experts import DenseExpertExecutor, ExpertExecutor
from .model import Model, load_model
from .session import Session

__all__ = ["DenseExpertExecutor", "ExpertExecutor", "Model", "Session", "load_model"]
