"""rbln storages: a host view PyTorch sees, a device buffer the NPU uses, and residency.

Every rbln storage carries a :class:`Buffer` (``storage._rbln``):

* ``host``  the storage's own memory (its data pointer, the "virtual address" PyTorch sees);
* ``block`` the device buffer, a :class:`~.arena.Block` in the device's arena, allocated at the
  first device use (or at creation with ``TORCH_RBLN_EAGER_MALLOC=1``);
* ``state`` which side holds the latest data: ``HOST``, ``DEVICE`` or ``SYNCED`` (both).

The transitions between the states, and the transfers they record, are the README's residency
table (section "Device tensors and memory").

The Buffer lives exactly as long as the storage (PyTorch preserves the storage's Python object
while any tensor uses it); its ``__del__`` returns the device block and the host memory.
"""

from __future__ import annotations

import ctypes
import threading

import torch

from .. import config, events
from . import devices

HOST, DEVICE, SYNCED = 0, 1, 2

CPU_KEYSET = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
_CPU = torch.device("cpu")
_cpu_storage = torch._C._construct_storage_from_data_pointer
_InferenceMode = torch._C._InferenceMode    # the C++ guard behind torch.inference_mode
_record = events.record


class HostPool:
    """Recycles host views by rounded size so creating a tensor rarely calls the allocator.

    Each entry keeps its flat typed views (``Buffer._hflat``) too, so a recycled host view
    does not rebuild them."""

    ROUND = 64
    LIMIT = 256 << 20

    def __init__(self):
        self._free: dict[int, list[tuple[torch.Tensor, dict]]] = {}
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, nbytes: int) -> tuple[torch.Tensor, dict]:
        size = max(self.ROUND, (nbytes + self.ROUND - 1) // self.ROUND * self.ROUND)
        lst = self._free.get(size)
        if lst:
            with self._lock:
                if lst:
                    self._bytes -= size
                    return lst.pop()
        return torch.empty(size, dtype=torch.uint8), {}

    def put(self, mem: torch.Tensor, flats: dict) -> None:
        size = mem.numel()
        if self._bytes + size > self.LIMIT or size > (16 << 20):
            return
        with self._lock:
            self._free.setdefault(size, []).append((mem, flats))
            self._bytes += size

    def clear(self) -> None:
        with self._lock:
            self._free.clear()
            self._bytes = 0


host_pool = HostPool()


class Buffer:
    __slots__ = ("index", "nbytes", "host", "block", "state", "pooled", "_hflat", "_dflat",
                 "_dalias", "scanned", "__weakref__")

    def __init__(self, index: int, host: torch.Tensor, nbytes: int, pooled: bool,
                 flats: dict | None = None):
        self.index = index
        self.nbytes = nbytes
        self.host = host            # CPU tensor owning the host view's memory
        self.block = None
        self.state = HOST
        self.pooled = pooled
        self._hflat = {} if flats is None else flats   # dtype -> flat CPU tensor over host
        self._dflat = {}            # dtype -> flat CPU tensor over the device block
        self._dalias = {}           # (dtype, size, stride, offset) -> alias (device_input)
        self.scanned = None         # dtype the NaN/Inf scan found all finite (until a write)

    def __del__(self):
        try:
            b = self.block
            if b is not None:
                self.block = None
                b.arena.free(b)
            if self.pooled:
                host_pool.put(self.host, self._hflat)
        except Exception:  # interpreter shutdown
            pass

    # device memory -------------------------------------------------------------------------
    def _ensure_block(self, with_memory: bool = True):
        b = self.block
        if b is None:
            b = self.block = devices.arena(self.index).malloc(self.nbytes, with_memory)
            self._dflat.clear()
            self._dalias.clear()
        elif b.mem is None and with_memory:
            b.mem = torch.empty(b.size, dtype=torch.uint8)
            self._dflat.clear()
            self._dalias.clear()
        return b

    def _push(self):
        self._ensure_block()
        self._dbytes().copy_(self._hbytes())
        _record("h2d", "", self.nbytes)

    def _pull(self):
        self._hbytes().copy_(self._dbytes())
        _record("d2h", "", self.nbytes)

    # residency transitions -----------------------------------------------------------------
    def host_read(self) -> None:
        if self.state == DEVICE:
            self._pull()
            self.state = SYNCED

    def host_write(self, whole: bool = False) -> None:
        self.scanned = None
        if self.state == DEVICE and not whole:
            self._pull()
        self.state = HOST

    def device_read(self) -> None:
        if self.state == HOST:
            self._push()
            self.state = SYNCED
        elif self.block is None or self.block.mem is None:  # SYNCED/DEVICE always have memory
            self._ensure_block()

    def device_write(self, whole: bool = False) -> None:
        self.scanned = None
        if self.state == HOST and not whole:
            self._push()
        else:
            self._ensure_block()
        self.state = DEVICE

    def adopt_device(self, mem: torch.Tensor) -> None:
        """Make ``mem`` (a program's contiguous output covering this whole storage) the device
        buffer: the program wrote straight into device memory, nothing is copied."""
        b = self.block
        if b is None:
            b = self.block = devices.arena(self.index).malloc(self.nbytes, with_memory=False)
        b.mem = mem
        self._dflat.clear()
        self._dalias.clear()
        self.state = DEVICE
        self.scanned = None

    # CPU tensors over either side ----------------------------------------------------------
    @staticmethod
    def _flat(mem: torch.Tensor, cache: dict, dtype: torch.dtype) -> torch.Tensor:
        """``mem``'s whole storage as a flat CPU tensor of ``dtype`` (cached per dtype)."""
        f = cache.get(dtype)
        if f is None:
            # a separate, non-resizable storage over the same bytes: a CPU kernel that tries to
            # resize an alias fails loudly instead of moving the memory under the rbln storage
            st = mem.untyped_storage()
            alias = _cpu_storage(st.data_ptr(), _CPU, st.nbytes())
            # a normal tensor even under inference mode: the flat outlives the call (host
            # views are pooled) and is written in place outside inference mode too
            with _InferenceMode(False):
                f = cache[dtype] = torch.empty(0, dtype=dtype).set_(
                    alias, 0, (st.nbytes() // dtype.itemsize,), (1,))
        return f

    def _hbytes(self) -> torch.Tensor:
        return self._flat(self.host, self._hflat, torch.uint8)[: self.nbytes]

    def _dbytes(self) -> torch.Tensor:
        return self._flat(self.block.mem, self._dflat, torch.uint8)[: self.nbytes]

    def host_alias(self, t: torch.Tensor) -> torch.Tensor:
        """A CPU tensor with ``t``'s metadata over the host view (no residency change)."""
        return _lazy_bits(t, self._flat(self.host, self._hflat, t.dtype).as_strided(
            t.size(), t.stride(), t.storage_offset()))

    def device_alias(self, t: torch.Tensor) -> torch.Tensor:
        """A CPU tensor with ``t``'s metadata over the device buffer (no residency change)."""
        return _lazy_bits(t, self._flat(self.block.mem, self._dflat, t.dtype).as_strided(
            t.size(), t.stride(), t.storage_offset()))

    def device_input(self, t: torch.Tensor) -> torch.Tensor:
        """``device_alias`` for a program operand: data and metadata are only read.

        The alias may be shared between calls, so it must never be resized or restrided:
        either the adopted program output that *is* the device memory, when ``t`` spans it
        unchanged (one op's result feeding the next), or an alias cached per metadata (weights
        and other long-lived operands; dropped whenever the memory changes)."""
        mem = self.block.mem
        dtype, size, stride, offset = t.dtype, t.shape, t.stride(), t.storage_offset()
        if mem.dtype is dtype and not offset and mem.shape == size and mem.stride() == stride:
            return _lazy_bits(t, mem)
        key = (dtype, size, stride, offset)
        cache = self._dalias
        a = cache.get(key)
        if a is None:
            if len(cache) >= _ALIAS_CACHE:   # many views of one storage (a KV cache): start over
                cache.clear()
            a = cache[key] = self._flat(mem, self._dflat, dtype).as_strided(size, stride, offset)
        return _lazy_bits(t, a)


_ALIAS_CACHE = 8     # aliases kept per Buffer by device_input


def _lazy_bits(t: torch.Tensor, alias: torch.Tensor) -> torch.Tensor:
    """Carry ``t``'s lazy conjugate / negative bits over to its alias."""
    if t.is_conj():
        alias = alias.conj()
    if t.is_neg():
        alias = alias._neg_view()
    return alias


# ------------------------------------------------------------------------------------------
# making rbln tensors over host memory

_GetPtr = ctypes.pythonapi.PyCapsule_GetPointer
_GetPtr.restype = ctypes.c_void_p
_GetPtr.argtypes = [ctypes.py_object, ctypes.c_char_p]
_DEV_BYTES = [(12).to_bytes(4, "little") + i.to_bytes(4, "little") for i in range(64)]
_to_dlpack = torch._C._to_dlpack
_from_dlpack = torch._C._from_dlpack
_memmove = ctypes.memmove


def _wrap(cpu: torch.Tensor, index: int) -> torch.Tensor:
    """The rbln:index tensor over ``cpu``'s memory, same sizes and strides.

    PyTorch's DLPack import maps ``kDLExtDev`` to PrivateUse1 and keeps ``cpu`` alive as long as
    the new storage lives. This is the one route that works for every device index."""
    cap = _to_dlpack(cpu)
    p = _GetPtr(cap, b"dltensor")
    _memmove(p + 8, _DEV_BYTES[index], 8)   # DLTensor.device = {kDLExtDev, index}
    return _from_dlpack(cap)


def storage_nbytes(size, stride, itemsize: int) -> int:
    n = 1
    for s, st in zip(size, stride):
        if s == 0:
            return 0
        n += (s - 1) * st
    return n * itemsize


def _eager_malloc() -> bool:
    """TORCH_RBLN_EAGER_MALLOC, read at every allocation."""
    return config.live("TORCH_RBLN_EAGER_MALLOC")


def new_tensor(size, stride, dtype: torch.dtype, index: int) -> torch.Tensor:
    """A fresh rbln tensor: host view from the pool, device buffer booked lazily."""
    nbytes = storage_nbytes(size, stride, dtype.itemsize)
    host, flats = host_pool.get(nbytes)
    cpu = Buffer._flat(host, flats, dtype).as_strided(size, stride)
    t = _wrap(cpu, index)
    buf = Buffer(index, host, nbytes, True, flats)
    t.untyped_storage()._rbln = buf
    if _eager_malloc():
        buf._ensure_block()
    return t


def new_device_tensor(mem: torch.Tensor, nbytes: int, index: int) -> torch.Tensor:
    """A fresh rbln tensor whose device buffer *is* ``mem``, a program output that owns its
    whole dense storage of ``nbytes`` bytes (device-latest, nothing copied).

    ``new_tensor`` followed by ``adopt_device``, in one step: this runs once per op output."""
    host, flats = host_pool.get(nbytes)
    t = _wrap(Buffer._flat(host, flats, mem.dtype).as_strided(mem.size(), mem.stride()), index)
    buf = Buffer(index, host, nbytes, True, flats)
    t.untyped_storage()._rbln = buf
    # the variable is still validated as at every allocation, but an adopted output is booked
    # now either way (with or without it, the arena's statistics move alike)
    _eager_malloc()
    block = buf.block = devices.arena(index).malloc(nbytes, with_memory=False)
    block.mem = mem
    buf.state = DEVICE
    return t


def wrap_host(cpu: torch.Tensor, index: int) -> torch.Tensor:
    """An rbln tensor whose host view *is* ``cpu``'s memory (zero copy; ``cpu`` must own its
    storage from offset 0, e.g. a fresh CPU kernel output). State: host-latest."""
    st = cpu.untyped_storage()
    base = torch.empty(0, dtype=torch.uint8).set_(st, 0, (st.nbytes(),), (1,))
    t = _wrap(cpu, index)
    buf = Buffer(index, base, t.untyped_storage().nbytes(), False)
    t.untyped_storage()._rbln = buf
    if _eager_malloc():
        buf._ensure_block()
    return t


def buffer_of(t: torch.Tensor) -> Buffer:
    st = t.untyped_storage()
    try:
        return st._rbln
    except AttributeError:
        return _adopt(st)


def _adopt(st) -> Buffer:
    """A storage we did not create (made by a PyTorch path that bypassed our allocator): its
    memory becomes the host view."""
    if st.device.type != "rbln":
        raise TypeError(f"expected an rbln storage, got one on {st.device}")
    cpu_st = torch._C._construct_storage_from_data_pointer(st.data_ptr(), torch.device("cpu"), st.nbytes())
    base = torch.empty(0, dtype=torch.uint8).set_(cpu_st, 0, (st.nbytes(),), (1,))
    buf = Buffer(st.device.index or 0, base, st.nbytes(), False)
    st._rbln = buf   # lives exactly as long as the storage that owns the memory
    return buf
