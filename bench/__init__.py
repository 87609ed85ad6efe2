"""Comparing Ostinato with other systems: the session simulator and its baselines, side-by-side kernel and
llama.cpp runs, the LRU baseline's executor, measured tables. It may import every side of the product;
nothing in the product imports it. Each benchmark runs as `python -m ostinato.bench.NAME`."""
