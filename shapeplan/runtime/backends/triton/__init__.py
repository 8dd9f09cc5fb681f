"""The Triton subsystem (see docs/gpu.md)."""
