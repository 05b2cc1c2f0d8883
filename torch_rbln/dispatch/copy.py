"""The copy engine: every copy that touches an rbln tensor (``copy_``, ``.to()``, ``.item()``).

Which copy runs where and what it reports is the README's copy table (section "Device tensors
and memory").
"""

from __future__ import annotations

import time

import torch

from .. import events
from ..runtime.storage import DEVICE, HOST, SYNCED, host_input, state_of
from . import factories
from .layout import spans_storage

_record = events.record


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _h2d(src: torch.Tensor, dst: torch.Tensor) -> None:
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
            db.device_alias(dst).copy_(sb.device_alias(src))
            _record("runtime", "v2v", time.perf_counter_ns() - t0)
            return
        # the latest bytes are on the host: the runtime serves the copy there
        _record("v2v_slow", "src_synced_host_served" if state == SYNCED else "src_not_on_device", nbytes)
        if state == HOST:
            _record("v2v_reject", "src_not_on_device", nbytes)
        db.host_write(whole=spans_storage(dst, db.nbytes))
        db.host_alias(dst).copy_(sb.host_alias(src))
        return
    # non-direct: dtype conversion, broadcast, strided or cross-device copy through the host
    _record("bounce", "copy_d2d_host_bounce", nbytes)
    sb.host_read()
    src_cpu = sb.host_alias(src)
    if same:
        src_cpu = src_cpu.clone()   # overlapping source and destination
    db.host_write(whole=spans_storage(dst, db.nbytes))
    db.host_alias(dst).copy_(src_cpu)


def copy_from(self: torch.Tensor, dst: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    """``aten::_copy_from(self, dst)``: copy ``self`` into ``dst``."""
    s_rbln = self.device.type == "rbln"
    d_rbln = dst.device.type == "rbln"
    if dst.numel() == 0:
        return dst
    if s_rbln and d_rbln:
        _d2d(self, dst)
    elif s_rbln:
        _d2h(self, dst)
    else:
        _h2d(self, dst)
    return dst


def copy_from_and_resize(self: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    if dst.shape != self.shape:
        if dst.device.type == "rbln":
            factories.resize_(dst, self.shape)
        else:
            dst.resize_(self.shape)
    return copy_from(self, dst)


def local_scalar_dense(self: torch.Tensor):
    """``.item()``: a host read of one element."""
    return host_input(self).item()


# Copies into (or from) a conjugate or negative view reach the copy engine with the view's
# lazy bit, which its host and device aliases carry, so the CPU copy underneath writes the
# conjugated / negated values into the base. Without these pass-throughs PyTorch's math-bit
# fallback would hand the engine a resolved *clone* of ``dst`` (``_copy_from`` does not mark
# ``dst`` as written) and the write would be lost.
MATH_BIT_PASSTHROUGH = ("_copy_from", "_copy_from_and_resize")

KERNELS = {
    "_copy_from": copy_from,
    "_copy_from_and_resize": copy_from_and_resize,
    "_local_scalar_dense": local_scalar_dense,
}
