"""Native CPU kernels: C/C++ sources in ``csrc/``, each library bound by one small module.

``build`` compiles a library once per machine and caches it; ``gemv``, ``amx_gemm`` and
``qgemm`` are the matmuls, ``ops`` the Llama layer's elementwise ops, ``attention`` the paged
attention kernel of the CPU backend, and ``quantized`` the GGUF block formats ``qgemm`` reads.
"""
