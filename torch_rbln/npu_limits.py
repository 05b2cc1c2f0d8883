"""torch.cuda functions whose meaning is device-generic but which the virtual NPU cannot answer:
each raises, naming why (docs/torch-rbln.md ("torch.rbln API")). The reasons are data: one line per name."""

from __future__ import annotations

REASONS = {
    "utilization": "the virtual NPU has no utilization counter (there is no management library "
                   "like NVML; rbln-smi reports physical NPUs)",
    "memory_usage": "the virtual NPU has no memory-bandwidth counter (no management library "
                    "like NVML)",
    "temperature": "the virtual NPU has no temperature sensor",
    "power_draw": "the virtual NPU has no power sensor",
    "clock_rate": "the virtual NPU has no SM clock to report",
    "list_gpu_processes": "the virtual NPU has no per-process accounting; the processes "
                          "holding an NPU are named in the warning a second user gets",
    "memory_snapshot": "the rbln arena does not record per-block history; memory_stats() and "
                       "memory_summary() give its totals",
    "set_per_process_memory_fraction": "the device memory is sized once per process by "
                                       "TORCH_RBLN_DEVICE_MEMORY; there is no fraction to set",
    "caching_allocator_enable": "the rbln arena always caches freed blocks (empty_cache() "
                                "releases them); caching cannot be switched off",
    "caching_allocator_disabled": "the rbln arena always caches freed blocks (empty_cache() "
                                  "releases them); caching cannot be switched off",
    "ipc_collect": "rbln tensors cannot be shared between processes (no CUDA IPC), so there "
                   "is nothing to collect",
}

__all__ = list(REASONS)


def _raiser(name: str, reason: str):
    def fn(*args, **kwargs):
        raise RuntimeError(f"torch.rbln.{name} does not apply to an NPU: {reason}")
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = f"Raises RuntimeError: {reason}."
    return fn


globals().update({name: _raiser(name, reason) for name, reason in REASONS.items()})
