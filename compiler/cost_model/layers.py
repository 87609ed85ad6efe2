"""A layer from its parts in the order the runtime runs them, and the eager forwards built from such layers:
split-route and upload-once prefill.

Order of work in a layer (every system priced here): the dense part before the experts (attention with
its compressor and indexer, mHC, norms, the router) runs first, since the routes come out of the router;
then the GPU's hot experts with the shared expert and the host's cold experts (+ activations over the link
both ways, + the per-layer task hand-off host.handoff_s: measured, grown to the host's cores by
ostinato/host_sync.py) run concurrently:
    layer = attention + router + max(hot + shared expert, cold + hand-off)
(split_layer; on a cpu-only spec the two sides share the cores and add up).
- split-route prefill: that layer with n tokens' expected routes;
- upload-once prefill: the distinct cold experts cross the link once, double-buffered against the
  GPU's compute of the layer: the layer takes the longer of upload and compute.
Each is priced as one forward (split_forward, upload_forward) and as a prompt (split_prefill, upload_prefill):
its forwards of the plan's prefill chunk, as the runtime runs a longer one (chunks.py).
Sharded upload-once is sharded.py's; the fixed-shape steps (decode, buckets) are decode.py's and buckets.py's.
"""

from __future__ import annotations


class LayerComposition:
    """CostModel's layers and eager forwards (from device pricing, attention by position and the forward's
    overheads)."""

    def layer_seconds(self, first, gpu, cpu):
        """A layer from its parts in the order the runtime runs them: `first` (the dense part before the experts:
        the routes come out of its router), then the GPU side (hot experts and the shared expert) and the host
        side (cold experts with their hand-off) concurrently, unless they share the same cores (cpu-only)."""
        return first + self.overlap(gpu, cpu)

    def split_layer(self, layer: int, n: int, position: int | None = None, step_context: int | None = None,
                    threads: int | None = None) -> tuple[float, float, float]:
        """(seconds before the experts, GPU seconds, CPU seconds) of split-route for n tokens after `position`:
        the layer takes layer_seconds of them. `step_context`: a fixed-shape step's (before_experts_time);
        `threads`: the CPU expert pool's (None: every core; a decode step's: pool_threads.py)."""
        gpu = self.shared_expert_time(layer, n) + self.gpu_experts_time(self.distinct(layer, n, True),
                                                                        self.routes(layer, n, True), threads)
        return (float(self.before_experts_time(layer, n, position, step_context=step_context)), gpu,
                self.cpu_experts_time(n, self.distinct(layer, n, False), self.routes(layer, n, False), threads))

    def upload_layer(self, layer: int, n: int, position: int | None = None) -> tuple[float, float]:
        """(upload seconds, GPU compute seconds) of upload-once for n tokens after `position`: every route runs on
        the GPU, after its layer's dense part."""
        cold = self.distinct(layer, n, False)
        if self.hw.cpu_only:  # one CPU kernel either way: each part at its own tokens per expert, as split-route
            experts = (self.gpu_experts_time(self.distinct(layer, n, True), self.routes(layer, n, True))
                       + self.gpu_experts_time(cold, self.routes(layer, n, False)))
        else:
            experts = self.gpu_experts_time(self.distinct(layer, n, True) + cold, n * self.cfg.num_experts_per_tok)
        return self.upload_time(cold), float(self.attention_time(layer, n, position)) + experts

    def pipelined(self, per: list[tuple[float, float]]) -> float:
        """Layers of (upload, compute), double-buffered: layer l+1's upload overlaps layer l's compute;
        the first upload is exposed."""
        nxt = [per[l + 1][0] if l + 1 < len(per) else 0.0 for l in range(len(per))]
        return per[0][0] + sum(self.overlap(per[l][1], nxt[l]) for l in range(len(per)))

    def split_forward(self, n: int, position: int | None = None) -> float:
        """One split-route forward of n tokens after `position`."""
        layers = sum(self.layer_seconds(*self.split_layer(l, n, position)) for l in range(len(self.layers)))
        return float(self.forward_time(layers, n, decode=False, eager=True))

    def upload_forward(self, n: int, position: int | None = None) -> float:
        """One upload-once forward of n tokens after `position`: its layers' distinct cold experts uploaded."""
        per = [self.upload_layer(l, n, position) for l in range(len(self.layers))]
        return float(self.forward_time(self.pipelined(per), n, decode=False, eager=True))

    def split_prefill(self, n: int, position: int | None = None) -> float:
        """A prompt of n tokens after `position` split-route, as the runtime runs it: split_forward over its
        chunks (chunks.py)."""
        return self.chunked(self.split_forward, n, position)

    def upload_prefill(self, n: int, position: int | None = None) -> float:
        """A prompt of n tokens after `position` upload-once over one link: upload_forward over its chunks, each
        uploading its own distinct cold experts (chunks.py)."""
        return self.chunked(self.upload_forward, n, position)
