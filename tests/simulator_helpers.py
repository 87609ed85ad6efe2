"""The hand-built machine the simulator and cost-model tests price on: round numbers, so every expected
time is computed by hand in the test that states it."""

from ostinato.hardware import parse_hardware

EXPERT = 1000          # bytes per expert
MS = 1e-3
# GPU reads an expert in 1 ms, the host in 10 ms, the link moves one in 100 ms; FLOPs never bind.
HW = parse_hardware({
    "name": "hand", "description": "hand-built",
    "gpus": {"name": "g", "count": 1, "usable_bytes": 10 ** 6, "bandwidth": 1e6,
             "matmul_flops": 1e15, "launch_overhead_s": 0.0},
    "host": {"cores": 1, "usable_bytes": 10 ** 9, "bandwidth": 1e5, "matmul_flops": 1e15, "isa": "avx2",
             "op_dispatch_s": 0.0, "task_handoff_s": 0.0},
    "link": {"h2d_bandwidth": 1e4, "d2h_bandwidth": 1e4, "latency_s": 0.0}}, "hand")
ACT = 4 / 1e4          # one token's activation (hidden 1, fp32) over the link, one way
