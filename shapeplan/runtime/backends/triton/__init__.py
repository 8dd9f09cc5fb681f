"""The Triton backend package (backend, codegen, lowerings, kernels, launch, workers)."""
