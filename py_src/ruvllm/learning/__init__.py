"""MicroLoRA: low-rank adapters that wrap weights, the backward pass, learning from feedback.

- `lora.py`: adapters (PEFT files), LoRAMatrix, AdapterSet (held, selected, applied, merged).
- `backprop.py`: gradients of a sequence's log-likelihood with respect to adapters.
- `learn.py`: optimizer steps with elastic weight consolidation.
"""
