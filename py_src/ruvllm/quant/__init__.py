"""Compute forms of weight matrices: how a matrix lives in memory while the model runs (float32, int8
codes, packed int4) and how it is multiplied, on CPython (BLAS) and in Pyodide (einsum).

- `matrices.py`: DenseMatrix, Int8Matrix, Int4Matrix, one interface.
"""
