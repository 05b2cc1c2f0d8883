"""Optimizer steps as device programs: ``torch.optim.Adam`` / ``AdamW`` with ``fused=True``, and
``torch.amp.GradScaler``'s unscale and scale update.

PyTorch calls ``aten::_fused_adam_`` / ``_fused_adamw_`` once per (device, dtype) group with
every parameter, gradient and optimizer state of the group. On rbln that call is one device
program: each tensor is updated in place in device memory with NPU numerics (the update's
arithmetic in fp32, one rounding per element written), which is what PyTorch's CPU fused
kernel computes, run here on the device buffers. Nothing crosses to the host: the gradients the
backward programs left in device memory are read there, and a parameter's only per-step cost
beyond the math is dropping its kept widened form (its contents changed).

The default ``foreach`` implementation is not this: its list ops are host ops, as on the NPU, and
each step moves parameters, gradients and states to the host and back (the fallback log and
``explain()`` show it).

A gradient scaler's two ops are device programs too, as CUDA runs them as kernels:
``aten::_amp_foreach_non_finite_check_and_unscale_`` (one per device and dtype of the
gradients: multiply each by the inverse scale in place, set ``found_inf`` on a NaN/Inf) and
``aten::_amp_update_scale_`` (the scale and growth tracker after a step). They compute what the
CPU's kernels compute, on the device buffers, so the gradients stay in device memory and only
``found_inf`` is read by the host (``GradScaler.step`` asks it whether to skip the step, as on
CUDA).

Each program is compiled once per layout (shapes, dtypes, flags): a ``recompile`` event, then
``warm_hit``; no pre-dispatch checks (an infinity in a gradient is exactly what the scaler
looks for, and its bookkeeping is float32 and int32 by definition).
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
SCALER_OPS = ("_amp_foreach_non_finite_check_and_unscale_", "_amp_update_scale_")

# program layouts compiled so far, per op (empty_cache() drops them: the next step compiles again)
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


def _start(event_name: str, key: tuple, index: int, operands) -> int:
    """Record the call (``dispatch``, then ``warm_hit`` or ``recompile`` for ``key``) after
    checking that every rbln operand is on device ``index``; the program's start time."""
    _record("dispatch", event_name)
    for t in operands:
        if _rbln(t) and t.device.index != index:
            raise devices.mixed_devices(index, t.device.index)
    if key in _compiled:
        _record("warm_hit", event_name)
    else:
        _compiled.add(key)
        _record("recompile", event_name, 0)
    return _span_start()


def _layout(ts) -> tuple:
    return tuple((tuple(t.shape), t.dtype) for t in ts)


def _adam(name: str):
    cpu = overload(name)
    event_name = "aten::" + name

    def kernel(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, *, lr,
               beta1, beta2, weight_decay, eps, amsgrad, maximize, grad_scale=None,
               found_inf=None):
        index = params[0].device.index if params else devices.current()
        key = (event_name, index, amsgrad, maximize, grad_scale is not None, _layout(params))
        t0 = _start(event_name, key, index, (*params, *grads, *exp_avgs, *exp_avg_sqs))
        written = grad_scale is not None          # a scaler's unscale rewrites the gradients
        args = ([_update(t) for t in params],
                [_update(t) if written else _read(t) for t in grads],
                [_update(t) for t in exp_avgs], [_update(t) for t in exp_avg_sqs],
                [_update(t) for t in max_exp_avg_sqs] if amsgrad else
                [_read(t) for t in max_exp_avg_sqs],
                [_read(t) for t in state_steps])
        cpu(*args, lr=_read(lr), beta1=beta1, beta2=beta2, weight_decay=weight_decay, eps=eps,
            amsgrad=amsgrad, maximize=maximize, grad_scale=_read(grad_scale),
            found_inf=_read(found_inf))
        _record_program(event_name, index, t0)

    kernel.__name__ = "rbln_" + name.replace(".", "_")
    return kernel


_UNSCALE = overload(SCALER_OPS[0])
_UPDATE_SCALE = overload(SCALER_OPS[1])


def amp_unscale(grads, found_inf, inv_scale):
    """``_amp_foreach_non_finite_check_and_unscale_``: the gradients rewritten in place."""
    name = "aten::" + SCALER_OPS[0]
    index = found_inf.device.index if _rbln(found_inf) else devices.current()
    t0 = _start(name, (name, index, _layout(grads)), index, (*grads, found_inf, inv_scale))
    _UNSCALE([_update(g) for g in grads], _update(found_inf), _read(inv_scale))
    _record_program(name, index, t0)


def amp_update_scale(scale, growth_tracker, found_inf, scale_growth_factor,
                     scale_backoff_factor, growth_interval):
    """``_amp_update_scale_``: the scale and growth tracker rewritten in place."""
    name = "aten::" + SCALER_OPS[1]
    index = scale.device.index if _rbln(scale) else devices.current()
    t0 = _start(name, (name, index), index, (scale, growth_tracker, found_inf))
    _UPDATE_SCALE(_update(scale), _update(growth_tracker), _read(found_inf), scale_growth_factor,
                  scale_backoff_factor, growth_interval)
    _record_program(name, index, t0)
    return scale


KERNELS = {name: _adam(name) for name in OPS}
KERNELS.update(zip(SCALER_OPS, (amp_unscale, amp_update_scale)))
