"""Measurements over a loaded engine: `perplexity.py` and `bench.py` (speed and memory)."""
