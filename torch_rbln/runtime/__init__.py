"""The virtual NPU runtime: devices, device memory, residency, the compiler and its programs.

Nothing here imports ``dispatch``, ``graph`` or the tools (docs/architecture.md)."""
