"""The triton backend: the cuda_graphs backend with fewer, fused Triton kernels inside the captured graph.

    backend.py         TritonBackend (registered as mode "triton"): warm-up, compile, checked capture, replay
    fusion.py          the segment rewrite: slots -> hand-written kernels and generated fused kernels
    codegen.py         one generated Triton kernel per run of elementwise slots (+ the elementwise lowerings)
    lowerings.py       ops that one hand-written kernel computes (binds a slot to a launcher of kernels/)
    verdicts.py        the capture-time check (tolerances) and its verdicts, kept on disk
    warmup.py          start-up: ``prepare``, the warm-up pool, parallel kernel compiles
    kernels/           the hand-written kernels: launchers (torch) beside Triton-only ``*_jit.py`` modules
    env.py             Triton's import (its cache under ours) and ``patch()``: the hooks below, installed
                       when a triton-mode engine is created, never by an import
    launch.py          load and launch our kernels through the CUDA driver API (no C builds)
    workers.py         compile new kernels in worker processes (+ compile_worker.py, the worker script)
    paths.py           where Triton's cache, generated sources and verdicts live; ``shapeplan cache``

Importing this package imports neither Triton nor torch: ``paths`` serves ``shapeplan cache`` and the
compile workers load ``kernels/*_jit.py`` by path (Triton only). docs/gpu.md describes the backend.
"""
