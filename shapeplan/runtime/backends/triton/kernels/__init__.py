"""Hand-written Triton kernels called by op kernels (e.g. the GGUF quantized matmuls in ``gguf``)."""
