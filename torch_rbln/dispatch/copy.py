"""The copy engine: every copy that touches an rbln tensor, with its residency and events.

=========================  ==============================================================
copy                       what the virtual NPU does
=========================  ==============================================================
cpu -> rbln                write into the host view (upload happens lazily at first device
                           use). A source that needs converting (dtype, layout) is staged on
                           the host first (``bounce h2d_staging``); a non-contiguous rbln
                           destination is written on the host (``bounce h2d_noncontig_dst``).
rbln -> cpu                host read of the source (a physical ``d2h`` if device-latest).
rbln -> rbln, direct       same dtype, same shape, both contiguous: the runtime's v2v engine.
                           A device-resident source is copied on the device; a source whose
                           latest data is on the host is served on the host
                           (``v2v_slow src_not_on_device`` / ``src_synced_host_served``).
rbln -> rbln, otherwise    dtype change, broadcast or strided layout: round trip through the
                           host (``bounce d2d_copy``).
=========================  ==============================================================
"""

from __future__ import annotations

import time

import torch

from .. import events
from ..runtime.storage import DEVICE, HOST, SYNCED, buffer_of
from . import factories

_record = events.record


def covers(t: torch.Tensor, buf) -> bool:
    """``t`` is contiguous and spans its whole storage (a write to it overwrites everything)."""
    return (t.storage_offset() == 0 and t.is_contiguous()
            and t.numel() * t.element_size() == buf.nbytes)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _h2d(src: torch.Tensor, dst: torch.Tensor) -> None:
    buf = buffer_of(dst)
    if src.dtype != dst.dtype or not src.is_contiguous() or src.shape != dst.shape:
        _record("bounce", "copy_h2d_staging", _nbytes(src))
    if not dst.is_contiguous():
        _record("bounce", "copy_h2d_noncontig_dst", _nbytes(dst))
    buf.host_write(whole=covers(dst, buf))
    buf.host_alias(dst).copy_(src)


def _d2h(src: torch.Tensor, dst: torch.Tensor) -> None:
    buf = buffer_of(src)
    buf.host_read()
    dst.copy_(buf.host_alias(src))


def _d2d(src: torch.Tensor, dst: torch.Tensor) -> None:
    sb, db = buffer_of(src), buffer_of(dst)
    nbytes = _nbytes(src)
    direct = (src.dtype == dst.dtype and src.shape == dst.shape and src.is_contiguous()
              and dst.is_contiguous() and sb is not db and src.device == dst.device)
    if direct:
        state = sb.state
        if state == DEVICE:
            t0 = time.perf_counter_ns()
            db.device_write(whole=covers(dst, db))
            db.device_alias(dst).copy_(sb.device_alias(src))
            _record("runtime", "v2v", time.perf_counter_ns() - t0)
            return
        # the latest bytes are on the host: the runtime serves the copy there
        _record("v2v_slow", "src_synced_host_served" if state == SYNCED else "src_not_on_device", nbytes)
        if state == HOST:
            _record("v2v_reject", "src_not_on_device", nbytes)
        db.host_write(whole=covers(dst, db))
        db.host_alias(dst).copy_(sb.host_alias(src))
        return
    # non-direct: dtype conversion, broadcast, strided or cross-device copy through the host
    _record("bounce", "copy_d2d_host_bounce", nbytes)
    sb.host_read()
    src_cpu = sb.host_alias(src)
    if sb is db:
        src_cpu = src_cpu.clone()   # overlapping source and destination
    db.host_write(whole=covers(dst, db))
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
    buf = buffer_of(self)
    buf.host_read()
    return buf.host_alias(self).item()


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
