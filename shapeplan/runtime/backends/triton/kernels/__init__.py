"""Hand-written Triton kernels, one module per family. Each module's ``@triton.jit`` functions import
Triton and nothing else, so a compile worker can load them by path."""
