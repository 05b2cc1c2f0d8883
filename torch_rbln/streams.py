"""torch.rbln streams and events (docs/torch-rbln.md ("Streams and events")).

A stream is an in-order queue of device work; an event marks a point of a stream's queue.
The virtual NPU runs each program to completion when it is launched, so an op is done when the
call returns; work that overlaps with the host (a non_blocking copy) is queued on the current
stream and runs on that stream's worker, in order. Streams and events live in the native core's
device guard, which ``torch.Stream(device="rbln")``, ``torch.Event(device="rbln")`` and
``torch.accelerator`` use as well.
"""

from __future__ import annotations

import torch

from . import _C
from .device_api import _check_index, _get_device_index
from .device_api import device as _device_ctx

__all__ = ["Stream", "Event", "current_stream", "default_stream", "set_stream", "stream",
           "StreamContext"]


def _index(device) -> int:
    """The (checked) index ``device`` names; the current device for None."""
    idx = _get_device_index(device, optional=True)
    return _check_index(_C.current_device() if idx < 0 else idx)


class Stream(torch.Stream):
    """An in-order queue of work on one rbln device (``torch.cuda.Stream``'s counterpart).

    Streams come from a fixed pool per device (32 besides the default stream); past it, new
    instances reuse earlier streams. ``priority`` is accepted and ignored (always 0)."""

    def __new__(cls, device=None, priority=0, **kwargs):
        if "stream_id" in kwargs:       # wrap an existing stream (current_stream() and friends)
            return super().__new__(cls, stream_id=kwargs["stream_id"],
                                   device_index=kwargs["device_index"],
                                   device_type=kwargs["device_type"])
        return super().__new__(cls, device=torch.device("rbln", _index(device)))

    @property
    def priority(self) -> int:
        return 0

    @staticmethod
    def priority_range() -> tuple[int, int]:
        return (0, 0)

    def wait_stream(self, stream) -> None:
        """Work queued on this stream afterwards waits for the work queued on ``stream``."""
        self.wait_event(stream.record_event())

    def record_event(self, event=None) -> "Event":
        """Record ``event`` (a new :class:`Event` if None) at this point of the stream."""
        event = Event() if event is None else event
        event.record(self)
        return event

    def __repr__(self) -> str:
        return f"torch.rbln.Stream(device={self.device}, stream_id={self.stream_id})"


class Event(torch.Event):
    """A point in a stream's work (``torch.cuda.Event``'s counterpart). The flags are accepted
    and ignored: events carry no timing and cannot cross processes."""

    def __new__(cls, enable_timing=False, blocking=False, interprocess=False):
        return super().__new__(cls, device="rbln")

    def elapsed_time(self, end_event) -> float:
        raise RuntimeError("RBLN does not support Event.elapsed_time (event timing is not "
                           "supported).")

    def ipc_handle(self):
        raise NotImplementedError("torch.Event ipc is not supported yet")

    @classmethod
    def from_ipc_handle(cls, device, handle):
        raise NotImplementedError("torch.Event ipc is not supported yet")

    def __repr__(self) -> str:
        return f"torch.rbln.Event(device={self.device})"


def _wrap(packed) -> Stream:
    stream_id, device_index, device_type = packed
    return Stream(stream_id=stream_id, device_index=device_index, device_type=device_type)


def current_stream(device=None) -> Stream:
    """The calling thread's current stream of ``device`` (the current device for None)."""
    return _wrap(_C._current_stream(_index(device)))


def default_stream(device=None) -> Stream:
    """The default stream of ``device`` (the current device for None)."""
    return _wrap(_C._default_stream(_index(device)))


def set_stream(stream) -> None:
    """Make ``stream`` the current stream of its device, and its device the current device.
    None: no-op."""
    if stream is None:
        return
    idx = _check_index(stream.device_index)
    _C._set_stream(stream.stream_id, idx)
    _C.set_device(idx)


class StreamContext:
    """Select ``stream`` (and its device) inside the block; on exit the previous stream of
    that device and the previous stream and device of the caller come back. None: no-op."""

    def __init__(self, stream):
        self.stream = stream
        self.src_prev = None
        self.dst_prev = None

    def __enter__(self):
        s = self.stream
        if s is None:
            return None
        self.src_prev = current_stream()
        if self.src_prev.device_index != s.device_index:
            with _device_ctx(s.device_index):
                self.dst_prev = current_stream()
        set_stream(s)
        return s

    def __exit__(self, *exc):
        if self.stream is None:
            return False
        if self.dst_prev is not None:
            set_stream(self.dst_prev)
        set_stream(self.src_prev)
        return False


def stream(stream) -> StreamContext:
    """``with torch.rbln.stream(s):`` runs the block with ``s`` as the current stream."""
    return StreamContext(stream)


# clock of the virtual NPU for ``_sleep`` (cycles -> seconds)
_SLEEP_HZ = 1e9


def _sleep(cycles: int) -> None:
    """Queue ``cycles`` NPU cycles of busy work on the current stream (``torch.cuda._sleep``:
    PyTorch's tests use it to have work still pending); the virtual NPU counts 1 GHz."""
    import time
    s = current_stream()
    _C._enqueue(s.stream_id, s.device_index, lambda: time.sleep(cycles / _SLEEP_HZ))
