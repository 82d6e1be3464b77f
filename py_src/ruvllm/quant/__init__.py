"""Compute forms of weight matrices: how a matrix lives in memory while the model runs (float32, int8
codes, packed int4) and how it is multiplied, on CPython (BLAS) and in Pyodide (einsum); and the codes
of the KV cache's cold positions.

- `matrices.py`: DenseMatrix, Int8Matrix, Int4Matrix, one interface.
- `kvcodes.py`: the int8/int4 codes of the KV cache's cold positions (both caches quantize with it).
"""
