"""``Work``: the handle a collective returns, over the transport's own handles.

A Work finishes once: the transport's operations completed, then what depends on them (check
what arrived, copy a staged tensor back). Whoever comes first finishes it: ``wait()``, or (for
collectives, whose gloo operations complete on gloo's threads) the completion of the
transport's futures, so that ``get_future()`` completes without a ``wait()`` too, as DDP's
reducer expects. The future then
holds the collective's tensors. gloo's point-to-point operations only complete when waited on,
so send/recv Works complete in ``wait()``.

Errors are translated once, into a message that says what probably happened, and re-raised by
every ``wait()``.
"""

from __future__ import annotations

import threading
from typing import Callable

import torch
import torch.distributed as dist


class Work(dist.Work):
    """``works``: the transport's handles; ``post``: what runs once they completed (a copy
    back, a check, a receive that depends on what arrived); ``auto``: complete on the
    transport's futures too (collectives), not only in ``wait()``."""

    def __init__(self, op: str, result, works=(), post: Callable[[], None] | None = None,
                 auto: bool = True,
                 translate: Callable[[BaseException], BaseException] | None = None):
        super().__init__()
        self._op = op
        self._result = result
        self._works = list(works)
        self._post = post
        self._translate = translate
        self._exc: BaseException | None = None
        self._lock = threading.Lock()
        self._done = False
        self._future = torch.futures.Future()
        if not self._works:
            self._run(None)
        elif auto:
            try:
                futures = [w.get_future() for w in self._works]
            except RuntimeError:        # "getFuture not implemented" (gloo's reduce_scatter)
                futures = None
            if futures:
                torch.futures.collect_all(futures).then(self._run)

    def _run(self, completed) -> None:
        """Finish the Work: in ``wait()`` (``completed`` None: wait for each handle) or as the
        callback of the transport's futures (all completed; never block there: gloo marks its
        Work finished only after the callbacks returned)."""
        if completed is None:
            self._lock.acquire()
        elif not self._lock.acquire(blocking=False):
            return                              # a wait() is finishing it
        try:
            if self._done:
                return
            try:
                failed = None
                for i, w in enumerate(self._works):
                    try:
                        if completed is None:
                            w.wait()
                        else:
                            completed.value()[i].value()
                    except BaseException as e:  # noqa: BLE001 - the first one is reported
                        failed = failed or e
                if failed is not None:
                    raise failed
                if self._post is not None:
                    self._post()
            except BaseException as e:  # noqa: BLE001 - handed to whoever waits
                self._exc = self._translate(e) if self._translate is not None else e
            self._done = True
        finally:
            self._lock.release()
        if self._exc is not None:
            self._future.set_exception(self._exc)
        else:
            self._future.set_result(self._result)

    # the torch.distributed.Work interface ---------------------------------------------------
    def wait(self, timeout=None) -> bool:
        """Block until the collective completed; raises its error. The group's timeout bounds
        the wait (``timeout`` here is accepted for the interface and not used)."""
        self._run(None)
        if self._exc is not None:
            raise self._exc
        return True

    def get_future(self) -> torch.futures.Future:
        return self._future

    def is_completed(self) -> bool:
        return self._done

    def is_success(self) -> bool:
        return self._done and self._exc is None

    def exception(self):
        return self._exc

    def result(self):
        self.wait()
        return self._result

    def synchronize(self) -> None:
        self.wait()

    def __repr__(self) -> str:
        state = ("failed" if self._exc is not None else "completed") if self._done else "pending"
        return f"<rbln-ccl Work {self._op} {state}>"
