"""MicroLoRA: low-rank adapters that wrap weights, the backward pass, learning from feedback.

- `lora.py`: adapters (PEFT files), LoRAMatrix.
- `adapters.py`: AdapterSet, the adapters a model holds (selected, applied, merged).
- `per_model.py`: what learning keeps per loaded model, held by its Session (calibration, bases, their jobs).
- `backprop.py`: gradients of a sequence's log-likelihood with respect to adapters.
- `learn.py`: optimizer steps with elastic weight consolidation.
- `state.py`: what an adapter keeps between lessons (Adam's moments, EWC terms, the lessons).
- `projection.py`: the input directions ordinary text uses most, which an adapter keeps out of.
- `xlora.py`: X-LoRA, several adapters mixed per token by a learned router.
"""
