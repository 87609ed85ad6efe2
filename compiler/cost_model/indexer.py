"""The CSA indexer's selection beyond its matmul: the score tensors it materializes, in bytes.

The runtime's indexer on the CPU (runtime/model/indexer.py `select`, and static_decode/indexer.py `select_fixed`)
writes its scores as whole float32 tensors (4 bytes a score), one op after another, so besides the matmul's FLOPs
(attention.py prices those with the core attention) it moves the bytes counted below. bench/indexer_cost.py
measures them beside these counts. A baseline's kernels keep their scores out of memory
(CostModel.with_csa_picks_only).
"""

from __future__ import annotations

# Per (query, compressed row, index head): the matmul's [T, HI, n] output written (4), relu read and written (8),
# the 1/sqrt(dI) scaling read and written (8), the head weighting read and written (8), the sum over heads read
# (4): 32 bytes;
INDEXER_BYTES_PER_QUERY_ROW_HEAD = 8 * 4
# ...and per (query, row): the [T, n] sum written (4), the future mask written (1 byte, bool), masked_fill
# reading both and writing (4 + 1 + 4), the top-k over rows reading the scores (4), its kept-mask read and
# written (4 + 1) and scanned by nonzero (count and write passes: 2 x 1): 25 bytes (the fixed-shape step's
# stable sort reads its 4 and writes value and index, 4 + 8, in place of the last three: priced alike).
INDEXER_BYTES_PER_QUERY_ROW = 4 + 1 + 9 + 4 + 5 + 2


# On a GPU the runtime's scores are one Triton kernel (runtime/kernels/triton_indexer.py): it sums the heads in
# registers and applies the mask, so per (query, row) only the [T, n] float32 scores written (4) and the top-k's
# passes (4 + 5 + 2) are left: 15 bytes, no per-head bytes, no mask pass. It reads each query's HI x dI q once
# (fused_indexer_bytes); the index keys it reads are attention_work's KV read (once a block of queries: from the
# L2 cache after the first, ceil(context / 4) x dI x 2 bytes = 6.5 MB at 100k tokens).
FUSED_INDEXER_BYTES_PER_QUERY_ROW = 4 + 4 + 5 + 2


def fused_indexer_bytes(heads: int, head_dim: int, n, rows, q_element_bytes: int):
    """Bytes the fused GPU indexer moves besides the keys when n queries score `rows` index keys: its scores and
    the top-k's passes over them, and the queries read. Elementwise over arrays."""
    return n * rows * FUSED_INDEXER_BYTES_PER_QUERY_ROW + n * heads * head_dim * q_element_bytes


def indexer_bytes(heads: int, n, rows):
    """Bytes the CSA indexer's intermediates move when n queries score `rows` index keys with `heads` heads (the
    counts above; the keys and queries themselves are the KV read, attention_work). Elementwise over arrays."""
    return n * rows * (heads * INDEXER_BYTES_PER_QUERY_ROW_HEAD + INDEXER_BYTES_PER_QUERY_ROW)


def indexer_time(heads: int, head_dim: int, n, rows, bandwidth: float, flops: float):
    """Seconds of the indexer's selection alone at a device's rates: its matmul's FLOPs (2 x heads x head_dim per
    query and row) plus its intermediates' bytes. Added, not max'ed: they are separate ops run one after
    another, the matmul bound by FLOPs and the elementwise passes by bytes, so neither hides the other
    (bench/indexer_cost.py measures index_scores' elementwise passes on top of its matmul)."""
    return 2 * heads * head_dim * n * rows / flops + indexer_bytes(heads, n, rows) / bandwidth
