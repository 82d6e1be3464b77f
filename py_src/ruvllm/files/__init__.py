"""Files: what is read from disk or from a download, checked at the boundary.

- `layout.py`: what files a model is made of (a GGUF file, or a folder's documents and weight files).
- `tensorfile.py`: safetensors files, read with NumPy into views of one buffer (paths, bytes, pieces).
- `formats.py`: storage formats of weight tensors (f32, f16, bf16, q8, q4_0, q4_1) and their bit layouts.
- `store.py`: a model folder's logical tensors over its files, each with its storage format.
- `jsonfields.py`: typed values out of the JSON files of a model folder.
- `gguf.py`: GGUF files read with NumPy, every tensor a view into one buffer.
- `gguf_model.py`: a GGUF file seen as a model folder (its config, Hugging Face tensor names, formats).
- `gguf_vocab.py`: a GGUF's tokenizer files, written from its metadata.
- `ggml.py`, `ggml_iq_tables.py`: ggml's tensor types and NumPy decoders of their blocks.
- `hub.py`: `hf:` names, downloaded once into the cache; `transfer.py`: one file over HTTP, checked.
- `json_body.py`: JSON request bodies, parsed with bounds and read field by field.
- `outputs.py`: names from outside that become paths; folders written whole or not at all.
"""
