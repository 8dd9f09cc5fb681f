"""Hand-written Triton kernels, one module per family: a launcher module (torch tensors in, shapes and
grids, ``out=`` buffers) beside a ``*_jit.py`` module that holds the ``@triton.jit`` functions and imports
Triton and nothing else, so a compile worker (``../compile_worker.py``) can load it by path.

    rows.py / rows_jit.py                          RMSNorm (+ residual), LayerNorm, Softmax, SiLU*mul, RoPE,
                                                   one decode step's KV cache write
    decode_attention.py / decode_attention_jit.py  split-K attention of one decode step over a static cache
    gemv.py / gemv_jit.py                          the fused decode GEMV (RMSNormMatMul / MatMulAdd, one row)
    gguf.py                                        GGUF quantized weights: decode GEMV, prefill GEMM, row
                                                   dequantization (QuantMatMul / QuantGather on CUDA)
    qgemv.py                                       one-row Q4_K / Q5_K / Q6_K / Q8_0 / Q4_0 / IQ4 GEMV with the
                                                   fused norm / gate / residual (QuantRMSNormMatMul,
                                                   QuantMatMulAdd)
    paged.py / paged_jit.py                        the paged KV cache: write (with RoPE of k), split-K decode
                                                   attention over each row's live blocks

Importing this package imports nothing; importing a launcher module imports Triton (``..env``), which
patches nothing.
"""
