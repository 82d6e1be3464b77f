"""Files: what is read from disk or from a download, checked at the boundary.

- `tensorfile.py`: safetensors files, read with NumPy into views of one buffer (paths, bytes, pieces).
- `formats.py`: storage formats of weight tensors (f32, f16, bf16, q8, q4_0, q4_1) and their bit layouts.
- `store.py`: a model folder's logical tensors over its files, each with its storage format.
- `jsonfields.py`: typed values out of the JSON files of a model folder.
"""
