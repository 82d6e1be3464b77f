"""The transformer: the blueprint, its weights, and the forward that reads and writes a KV cache.

- `config.py`: ModelConfig from a Hugging Face config.json.
- `weights.py`: containers named as the Hugging Face tensors, each matrix in its compute form; `linear`.
- `rope.py`: rotary position embeddings.
- `kv.py`: the interface every KV cache implements (what the forward asks of a cache), the segments.
- `cache.py`: the KV cache of one sequence (hot float32 tier, cold int8/int4 tier, byte budget).
- `blocks.py`: the paged cache's blocks: allocator, prefix registry (eviction order), storage.
- `transformer.py`: the blueprint, the weights and the RoPE frequencies as one object, what the forward takes.
- `forward.py`: attention, MLP, block, forward.
- `plan.py`: the decode plan: the whole forward as one program of kernel steps, run in one call.
- `paged.py`: the paged KV cache of continuous batching, with prefix sharing.
"""
