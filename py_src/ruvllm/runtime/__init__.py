"""Running a model: load, plan and compute under one lock; generate tokens.

- `engine.py`: a loaded model mapping token ids to logits (Engine, LoadOptions).
- `assembly.py`: a model assembled from its files, the one way every front end loads (load_engine).
- `planner.py`: the memory plan, made before anything is allocated.
- `isq.py`: runtime quantization of float models (round to nearest, activation-aware).
- `generate.py`: the token layer of generation (prefill, then one token per step; the Decoder).
- `batching.py`: continuous batching: one scheduler steps many sequences together (paged KV cache).
- `constrain/`: constrained decoding: token masks that keep the output valid JSON for a schema.
- `sampling.py`: sampler options and the sampler closure.
- `threads.py`: BLAS threads per forward call.
- `device.py`: where the decode plan runs: a GPU's memory (WebGPU), once its logits pass a check against the CPU.
"""
