"""The copy engine: every copy that touches an rbln tensor (``copy_``, ``.to()``, ``.item()``).

Which copy runs where and what it reports is the copy table of docs/tensors-and-memory.md.
"""

from __future__ import annotations

import logging
import time

import torch

from .. import _C, config, events
from ..runtime.storage import DEVICE, HOST, SYNCED, host_input, state_of
from . import factories
from .layout import spans_storage

_record = events.record
_log = logging.getLogger("torch_rbln")


class NonBlockingCopyError(RuntimeError):
    """A ``non_blocking=True`` copy cannot run asynchronously and its blocking fallback is
    disabled (``TORCH_RBLN_DISABLE_FALLBACK=non_blocking_copy``)."""


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _plain(t: torch.Tensor) -> bool:
    return t.is_contiguous() and not t.is_conj() and not t.is_neg()


def _why_blocking_h2d(src: torch.Tensor, dst: torch.Tensor) -> str | None:
    """Why a non_blocking host -> device copy cannot run on the copy engine (None: it can).
    The engine moves the bytes of pinned memory as they are, into a contiguous destination."""
    if not src.is_pinned():
        return "the source is not pinned memory; pin it with .pin_memory() or DataLoader(pin_memory=True)"
    if src.dtype != dst.dtype or src.shape != dst.shape:
        return "the copy converts the dtype or broadcasts"
    if not (_plain(src) and _plain(dst)):
        return "the source or the destination is not contiguous"
    return None


_warned_blocking = False


def _blocking_fallback(why: str) -> None:
    """A non_blocking copy served as a blocking one: a warning once, or the error when the
    ``non_blocking_copy`` fallback is disabled (read at each copy)."""
    global _warned_blocking
    if "non_blocking_copy" in config.live("TORCH_RBLN_DISABLE_FALLBACK"):
        raise NonBlockingCopyError(
            f"Non-blocking copy is not supported on RBLN devices for this copy: {why}. To "
            f"enable fallback to blocking copy, remove 'non_blocking_copy' from "
            f"`TORCH_RBLN_DISABLE_FALLBACK`.")
    if not _warned_blocking:
        _warned_blocking = True
        _log.warning("Non-blocking copy is not supported for this copy, falling back to "
                     "blocking copy: %s", why)


def _h2d(src: torch.Tensor, dst: torch.Tensor, non_blocking: bool = False) -> None:
    if non_blocking:
        why = _why_blocking_h2d(src, dst)
        if why is None:
            _C.copy_h2d_async(src, dst)   # queued on the current stream of dst's device
            return
        _blocking_fallback(why)
    state = state_of(dst)
    if src.dtype != dst.dtype or not src.is_contiguous() or src.shape != dst.shape:
        _record("bounce", "copy_h2d_staging", _nbytes(src))
    if not dst.is_contiguous():
        _record("bounce", "copy_h2d_noncontig_dst", _nbytes(dst))
    state.host_write(whole=spans_storage(dst, state.nbytes))
    state.host_alias(dst).copy_(src)


def _d2h(src: torch.Tensor, dst: torch.Tensor) -> None:
    dst.copy_(host_input(src))


def _d2d(src: torch.Tensor, dst: torch.Tensor) -> None:
    sb, db = state_of(src), state_of(dst)
    nbytes = _nbytes(src)
    same = sb == db        # one storage
    direct = (src.dtype == dst.dtype and src.shape == dst.shape and src.is_contiguous()
              and dst.is_contiguous() and not same and src.device == dst.device)
    if direct:
        state = sb.residency
        if state == DEVICE:
            t0 = time.perf_counter_ns()
            db.device_write(whole=spans_storage(dst, db.nbytes))
            s0 = events.span_start()
            db.device_alias(dst).copy_(sb.device_alias(src))
            events.record_copy("v2v", nbytes, dst.device.index, s0)
            _record("runtime", "v2v", time.perf_counter_ns() - t0)
            return
        # the latest bytes are on the host: the runtime serves the copy there
        _record("v2v_slow", "src_synced_host_served" if state == SYNCED else "src_not_on_device", nbytes)
        if state == HOST:
            _record("v2v_reject", "src_not_on_device", nbytes)
        db.host_write(whole=spans_storage(dst, db.nbytes))
        db.host_alias(dst).copy_(sb.host_alias(src))
        return
    # non-direct: dtype conversion, broadcast, strided or cross-device copy through the host.
    # Within one storage both host aliases share one CPU storage: the CPU's copy_ itself decides
    # about overlap (the same view: nothing to do; partly overlapping: its error)
    _record("bounce", "copy_d2d_host_bounce", nbytes)
    sb.host_read()
    src_cpu = sb.host_alias(src)
    db.host_write(whole=spans_storage(dst, db.nbytes))
    db.host_alias(dst).copy_(src_cpu)


# the dtype of the 0-dim tensor PyTorch wraps a Python number in (``copy_(2.0)`` reaches the
# kernel as the number itself)
_WRAPPED = {bool: torch.bool, int: torch.int64, float: torch.float64, complex: torch.complex128}


def copy_from(self: torch.Tensor, dst: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    """``aten::_copy_from(self, dst)``: copy ``self`` into ``dst``."""
    if not isinstance(self, torch.Tensor):     # a Python number: cast and broadcast as the CPU
        self, non_blocking = torch.tensor(self, dtype=_WRAPPED[type(self)]), False
    s_rbln = self.device.type == "rbln"
    d_rbln = dst.device.type == "rbln"
    if dst.numel() == 0:
        return dst
    if s_rbln and d_rbln:
        _d2d(self, dst)
    elif s_rbln:
        if non_blocking:   # the result is readable when the call returns
            _blocking_fallback("device to host copies complete before the call returns")
        _d2h(self, dst)
    else:
        _h2d(self, dst, non_blocking)
    return dst


def copy_from_and_resize(self: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    if not isinstance(self, torch.Tensor):
        self = torch.tensor(self, dtype=_WRAPPED[type(self)])
    if dst.shape != self.shape:
        if dst.device.type == "rbln":
            factories.resize_(dst, self.shape)
        else:
            dst.resize_(self.shape)
    return copy_from(self, dst)


_local_scalar_dense_cpu = torch.ops.aten._local_scalar_dense.default._op


def local_scalar_dense(self: torch.Tensor):
    """``.item()``: a host read of one element. Anything but one element (a direct call of
    the op) goes to the CPU kernel: its message for an empty tensor, the first element of
    several."""
    t = host_input(self)
    return t.item() if t.numel() == 1 else _local_scalar_dense_cpu(t)


# Copies into (or from) a conjugate or negative view reach the copy engine with the view's
# lazy bit, which its host and device aliases carry, so the CPU copy underneath writes the
# conjugated / negated values into the base. Without these pass-throughs PyTorch's math-bit
# fallback would hand the engine a resolved *clone* of ``dst`` (``_copy_from`` does not mark
# ``dst`` as written) and the write would be lost.
MATH_BIT_PASSTHROUGH = ("_copy_from", "_copy_from_and_resize")

# served natively between two rbln tensors (csrc/DataMovement.cpp: the `_d2d` rows of the copy
# table, no listener); the kernel here takes every other call, on PrivateUse2
NATIVE = ("_copy_from",)


def register_native() -> set:
    """Put the native kernel in front of :data:`NATIVE`; returns the names whose Python kernel
    the caller registers on PrivateUse2."""
    _C.register_native_copy()
    return set(NATIVE)


KERNELS = {
    "_copy_from": copy_from,
    "_copy_from_and_resize": copy_from_and_resize,
    "_local_scalar_dense": local_scalar_dense,
}
