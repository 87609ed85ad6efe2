"""Upload-once sharded over every GPU's link (runtime/engine/sharded_upload.py), on a spec of G >= 2 GPUs.

Each GPU uploads a 1/G slice of every distinct cold expert (along the intermediate axis) over its own link, all
G links at once as fast as the host memory feeds them (upload_time's links), and computes its slice (1/G of the
cold experts' bytes and FLOPs) double-buffered against the copies as the single-link upload is; the layer's
hidden states x [n, D] (the compute dtype) go out to the G - 1 other GPUs and each one's float32 partial [n, D]
comes back to the layer's GPU, added in GPU order (exchange_time). A spec has no peer-access field and the
planned GPUs (GeForce cards) have none, so the exchange is priced through the host: x down the layer's GPU's
link and up every other one's, the partials down theirs and up the layer's GPU's link one after another. The
exchange's host -> device bytes, (G - 1) x n x D x (x's element + 4), share the links with the slices (added to
the layer's upload); out and back are on the layer's critical path:
    layer = dense part before the experts + max(shared + hot + slice, out + slice) + back.
A prompt longer than the plan's prefill chunk runs one such forward a chunk (chunks.py): each chunk uploads its
own slices and exchanges its own tokens' activations.
"""

from __future__ import annotations


class ShardedUpload:
    """CostModel's sharded upload-once (from device pricing, attention by position and the layers' pipelining)."""

    @property
    def shards(self) -> int:
        """GPUs a sharded upload spreads over: every GPU of the spec (1 on a cpu-only spec: its "links" are
        copies within host memory)."""
        return 1 if self.hw.cpu_only else self.hw.gpus.count

    def exchange_bytes(self, n: int) -> tuple[int, int]:
        """(x, partial): bytes of n tokens' hidden states in the compute dtype (the dense format's element) and
        of one GPU's float32 partial output, each [n, D]."""
        elements = n * self.cfg.hidden_size
        return elements * self.kv_element_bytes, elements * 4

    def exchange_time(self, n: int) -> tuple[float, float]:
        """(out, back) seconds of a sharded layer's activations through the host (no peer access): x down the
        layer's GPU's link and up the others' at once; the G - 1 partials down their own links at once and up
        the layer's GPU's link one after another."""
        G, link = self.shards, self.hw.link
        if G < 2:
            return 0.0, 0.0
        x, partial = self.exchange_bytes(n)
        out = 2 * link.latency_s + x / link.d2h_bandwidth + x / link.h2d_bandwidth
        back = 2 * link.latency_s + partial / link.d2h_bandwidth + (G - 1) * partial / link.h2d_bandwidth
        return out, back

    def sharded_upload_layer(self, layer: int, n: int, position: int | None = None) -> tuple[float, float]:
        """(upload seconds, compute seconds) of the sharded upload-once for n tokens after `position`: the slices
        over all G links (with the exchange's host -> device bytes), each GPU's slice of the cold experts beside
        the layer's GPU's hot and shared experts, the exchange out and back (module docstring)."""
        return self.sharded_layer(layer, n, (self.distinct(layer, n, True), self.routes(layer, n, True)),
                                  (self.distinct(layer, n, False), self.routes(layer, n, False)), position)

    def sharded_layer(self, layer: int, n: int, hot: tuple[float, float], cold: tuple[float, float],
                      position: int | None = None) -> tuple[float, float]:
        """sharded_upload_layer with explicit (distinct experts, routes) of the layer's `hot` and `cold` experts
        (the session simulator feeds sampled traces through it)."""
        G = self.shards
        if G < 2:
            raise ValueError(f"a sharded upload needs 2+ GPUs: {self.hw.name} has "
                             f"{'none (cpu-only)' if self.hw.cpu_only else G}")
        x, partial = self.exchange_bytes(n)
        upload = self.upload_time(cold[0], (G - 1) * (x + partial), links=G)
        piece = self.gpu_experts_time(cold[0] / G, cold[1] / G)  # each GPU's 1/G of every cold expert
        home = self.shared_expert_time(layer, n) + self.gpu_experts_time(*hot)
        out, back = self.exchange_time(n)
        first = float(self.before_experts_time(layer, n, position))
        return upload, first + max(home + piece, out + piece) + back

    def sharded_forward(self, n: int, position: int | None = None) -> float:
        """One forward of upload-once sharded over every GPU's link: sharded_upload_layer's layers double-buffered
        as the single-link upload's."""
        per = [self.sharded_upload_layer(l, n, position) for l in range(len(self.layers))]
        return float(self.forward_time(self.pipelined(per), n, decode=False, eager=True))

    def sharded_prefill(self, n: int, position: int | None = None) -> float:
        """A prompt of n tokens after `position` upload-once sharded: sharded_forward over its chunks, each
        exchanging its own tokens' activations (chunks.py)."""
        return self.chunked(self.sharded_forward, n, position)
