"""Compute forms of weight matrices: how a matrix lives in memory while the model runs (float32, int8
codes, packed int4) and how it is multiplied, on CPython (BLAS) and in Pyodide (einsum); and the codes
of the KV cache's cold positions.

- `matrices.py`: DenseMatrix, Int8Matrix, Int4Matrix, one interface.
- `provider.py`: kernel providers, a faster home for the products where the runtime has one.
- `wasm.py`: the WebAssembly SIMD provider (kernels/kernels.c), driven from Python inside Pyodide.
- `native.py`: the same kernels on CPython, through wasmtime (kernels="wasm"; the `kernels` extra).
- `pool.py`: the same kernels on the kernel thread pool's threads (the `threads` load option of the npm package).
- `kvcodes.py`: the int8/int4 codes of the KV cache's cold positions (both caches quantize with it).
"""
