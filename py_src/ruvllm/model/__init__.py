"""The transformer: the blueprint, its weights, and the forward that reads and writes a KV cache.

- `config.py`: ModelConfig from a Hugging Face config.json.
- `weights.py`: containers named as the Hugging Face tensors, each matrix in its compute form; `linear`.
- `rope.py`: rotary position embeddings.
- `cache.py`: the KV cache (hot float32 tier, cold int8/int4 tier, byte budget).
- `forward.py`: attention, MLP, block, forward.
- `paged.py`: the paged KV cache of continuous batching, with prefix sharing.
"""
