"""Server counters in the Prometheus text format (hand-written: a dozen lines, no dependency)."""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field


@dataclass
class Metrics:
    requests: int = 0
    errors: int = 0                 # requests answered with a 4xx/5xx
    cancelled: int = 0              # requests stopped by a client disconnect
    prompt_tokens: int = 0
    prefilled_tokens: int = 0       # prompt tokens actually run through the model
    reused_tokens: int = 0          # prompt tokens served from a cached session
    generated_tokens: int = 0
    drafted_tokens: int = 0         # MTP drafts verified (speculative decoding)
    accepted_tokens: int = 0        # drafts the model's own pick agreed with
    batched_tokens: int = 0         # decode tokens run in batched steps with other requests' (--parallel)
    experts_swapped: int = 0        # experts promoted into a hot pool between turns (policy.adapt)
    adapt_bytes_uploaded: int = 0   # their uploads' bytes
    routes_hot: int = 0
    routes_cold: int = 0
    wait_sum: float = 0.0           # request arrival -> first token (queue + prefill + first pick)
    wait_count: int = 0
    waits: deque = field(default_factory=lambda: deque(maxlen=1000))
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add_wait(self, seconds: float) -> None:
        with self.lock:
            self.wait_sum += seconds
            self.wait_count += 1
            self.waits.append(seconds)

    def render(self, cache_stats, cached_sessions: int, store_stats=None) -> str:
        """The counters as Prometheus text; `store_stats`: the --session-dir store's (None: no store)."""
        with self.lock:
            w = sorted(self.waits)
            q = {p: (w[min(len(w) - 1, int(p * len(w)))] if w else 0.0) for p in (0.5, 0.9, 0.99)}
            routes = self.routes_hot + self.routes_cold
            rows = [
                ("ostinato_requests_total", "counter", "chat completion requests", self.requests),
                ("ostinato_request_errors_total", "counter", "requests answered with an error", self.errors),
                ("ostinato_cancelled_total", "counter", "requests stopped by a client disconnect", self.cancelled),
                ("ostinato_prompt_tokens_total", "counter", "prompt tokens of all requests", self.prompt_tokens),
                ("ostinato_prefilled_tokens_total", "counter", "prompt tokens run through the model",
                 self.prefilled_tokens),
                ("ostinato_reused_tokens_total", "counter", "prompt tokens reused from cached sessions",
                 self.reused_tokens),
                ("ostinato_generated_tokens_total", "counter", "generated tokens", self.generated_tokens),
                ("ostinato_drafted_tokens_total", "counter", "MTP draft tokens verified (speculative decoding)",
                 self.drafted_tokens),
                ("ostinato_accepted_tokens_total", "counter", "MTP draft tokens accepted", self.accepted_tokens),
                ("ostinato_batched_tokens_total", "counter",
                 "decode tokens run in one step with other requests' (ostinato-serve --parallel)", self.batched_tokens),
                ("ostinato_experts_swapped_total", "counter", "experts promoted into a hot pool between turns",
                 self.experts_swapped),
                ("ostinato_adapt_bytes_uploaded_total", "counter", "bytes uploaded for those promotions",
                 self.adapt_bytes_uploaded),
                ("ostinato_hot_route_share", "gauge", "share of expert routes computed from resident hot experts",
                 self.routes_hot / routes if routes else 0.0),
                ("ostinato_cache_hits_total", "counter", "requests that reused a cached session", cache_stats.hits),
                ("ostinato_cache_misses_total", "counter", "requests that started a new session",
                 cache_stats.misses),
                ("ostinato_cache_evictions_total", "counter", "cached sessions evicted (LRU)", cache_stats.evictions),
                ("ostinato_cache_truncations_total", "counter", "cached sessions cut back to a diverging request",
                 cache_stats.truncations),
                ("ostinato_cached_sessions", "gauge", "sessions in the prefix cache", cached_sessions),
            ]
            if store_stats is not None:
                rows += [
                    ("ostinato_session_files_saved_total", "counter", "sessions written to --session-dir",
                     store_stats.saved),
                    ("ostinato_session_files_loaded_total", "counter", "sessions read back from --session-dir",
                     store_stats.loaded),
                    ("ostinato_session_files_refused_total", "counter", "corrupt or foreign session files set aside",
                     store_stats.refused),
                    ("ostinato_session_files_deleted_total", "counter", "session files deleted for the byte bound",
                     store_stats.deleted),
                ]
            lines = []
            for name, kind, help_, value in rows:
                lines += [f"# HELP {name} {help_}", f"# TYPE {name} {kind}", f"{name} {value}"]
            lines += ["# HELP ostinato_wait_seconds request arrival to first generated token (queue + prefill)",
                      "# TYPE ostinato_wait_seconds summary"]
            lines += [f'ostinato_wait_seconds{{quantile="{p}"}} {v}' for p, v in q.items()]
            lines += [f"ostinato_wait_seconds_sum {self.wait_sum}", f"ostinato_wait_seconds_count {self.wait_count}"]
            return "\n".join(lines) + "\n"
