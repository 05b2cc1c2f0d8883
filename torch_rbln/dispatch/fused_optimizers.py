"""``torch.optim.Adam`` / ``AdamW`` with ``fused=True`` on rbln: one device program per step.

PyTorch calls ``aten::_fused_adam_`` / ``_fused_adamw_`` once per (device, dtype) group with
every parameter, gradient and optimizer state of the group. On rbln that call is one device
program: each tensor is updated in place in device memory with NPU numerics (the update's
arithmetic in fp32, one rounding per element written), which is what PyTorch's CPU fused
kernel computes, run here on the device buffers. Nothing crosses to the host: the gradients the
backward programs left in device memory are read there, and a parameter's only per-step cost
beyond the math is dropping its kept widened form (its contents changed).

The default ``foreach`` implementation is not this: its list ops are host ops, as on the NPU, and
each step moves parameters, gradients and states to the host and back (the fallback log and
``explain()`` show it). The program is compiled once per group layout (shapes, dtype, flags):
a ``recompile`` event, then ``warm_hit``; no pre-dispatch checks (an infinity in a gradient is
the optimizer's business: ``found_inf`` / ``grad_scale`` under a gradient scaler).
"""

from __future__ import annotations

import torch

from .. import events
from ..runtime import caches, devices
from ..runtime.storage import device_input, device_output
from .optable import overload

_record = events.record
_record_program = events.record_program
_span_start = events.span_start

OPS = ("_fused_adam_", "_fused_adam_.tensor_lr", "_fused_adamw_", "_fused_adamw_.tensor_lr")

# group layouts compiled so far, per op (empty_cache() drops them: the next step compiles again)
_compiled: set = set()


@caches.register
def _drop() -> None:
    _compiled.clear()


def _rbln(t) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type == "rbln"


def _read(t):
    return device_input(t) if _rbln(t) else t


def _update(t):
    """An operand the program reads and rewrites: its current data in device memory, then the
    device alias it is written through (device-latest afterwards)."""
    if not _rbln(t):
        return t
    device_input(t)
    return device_output(t)


def _kernel(name: str):
    cpu = overload(name)
    event_name = "aten::" + name

    def kernel(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, *, lr,
               beta1, beta2, weight_decay, eps, amsgrad, maximize, grad_scale=None,
               found_inf=None):
        _record("dispatch", event_name)
        index = params[0].device.index if params else devices.current()
        for t in (*params, *grads, *exp_avgs, *exp_avg_sqs):
            if _rbln(t) and t.device.index != index:
                raise devices.mixed_devices(index, t.device.index)
        key = (event_name, index, amsgrad, maximize, grad_scale is not None,
               tuple((tuple(p.shape), p.dtype) for p in params))
        if key in _compiled:
            _record("warm_hit", event_name)
        else:
            _compiled.add(key)
            _record("recompile", event_name, 0)
        written = grad_scale is not None          # a scaler's unscale rewrites the gradients
        args = ([_update(t) for t in params],
                [_update(t) if written else _read(t) for t in grads],
                [_update(t) for t in exp_avgs], [_update(t) for t in exp_avg_sqs],
                [_update(t) for t in max_exp_avg_sqs] if amsgrad else
                [_read(t) for t in max_exp_avg_sqs],
                [_read(t) for t in state_steps])
        t0 = _span_start()
        cpu(*args, lr=_read(lr), beta1=beta1, beta2=beta2, weight_decay=weight_decay, eps=eps,
            amsgrad=amsgrad, maximize=maximize, grad_scale=_read(grad_scale),
            found_inf=_read(found_inf))
        _record_program(event_name, index, t0)

    kernel.__name__ = "rbln_" + name.replace(".", "_")
    return kernel


KERNELS = {name: _kernel(name) for name in OPS}
