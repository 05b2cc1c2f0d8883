"""``ProcessGroupRBLN``: the ``rbln-ccl`` process group.

A Python ``torch.distributed.ProcessGroup`` (PyTorch calls its methods both from Python and,
through its trampoline, from C++: DDP's reducer, parameter broadcast, shape verification). The
transport is a gloo process group over the same store; no socket is opened here.

Per collective:

1. the tensors' devices are checked (one collective takes rbln tensors or CPU tensors, not a
   mix) and where the bytes move is decided: ``device`` for every collective on rbln tensors,
   except reductions (all_reduce, reduce_scatter) of a dtype other than float16 or an op other
   than SUM, which rbln-ccl hands to its gloo fallback through host memory, as the reference does;
2. the ranks agree that they run the same collective on matching tensors (``agreement``);
3. gloo moves the bytes of the memory ``staging`` picked, and a ``collective`` event records
   the collective, its size and where it ran;
4. by default the call returns once the transfer completed (the reference's synchronous mode);
   with ``TORCH_RBLN_C10D_ASYNC=1`` it returns at once and ``Work.wait()`` waits.

Collectives outside the reference's list raise (reduce, gather, all_to_all, ...).
"""

from __future__ import annotations

import datetime
import threading

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from .. import config
from ..runtime import devices
from . import agreement, rendezvous, shm, staging
from .staging import DEVICE, HOST, INOUT, READ, WRITE, Staging
from .work import Work

SUPPORTED = ("broadcast, scatter, all_gather (list, into one tensor, coalesced), all_reduce, "
             "reduce_scatter (list, tensor), send/recv and barrier")


_code = shm.code


def _is_sum(reduce_op) -> bool:
    return _code(reduce_op) == _code(dist.ReduceOp.SUM)


class ProcessGroupRBLN(dist.ProcessGroup):
    """The process group ``init_process_group(backend="rbln-ccl")`` creates."""

    def __init__(self, store, rank: int, size: int, timeout: datetime.timedelta,
                 group_id: str = "0"):
        super().__init__(rank, size)
        self._group = group_id
        self._timeout = timeout
        self.members = rendezvous.join(store, rank, size, group_id, timeout)
        self._gloo = dist.ProcessGroupGloo(dist.PrefixStore("gloo/", store), rank, size,
                                           timeout)
        self._gloo._set_sequence_number_for_group()
        self._seq = self._gloo._get_sequence_number_for_group()
        self._issued = 0        # collectives (not send/recv) issued, for error messages
        self._inbox: dict[tuple[int, int], _Receive] = {}   # (src, tag) -> latest receive
        # every rank on one host: collectives through shared memory (shm.py)
        self._shm = None
        if size > 1 and shm.same_host(self.members):
            uid = store.get(f"rbln_rccl_uid_{group_id}").decode()
            self._shm = shm.Channel(store, rank, size, uid, self.members, timeout)

    # identity -------------------------------------------------------------------------------
    def getBackendName(self) -> str:
        return "rbln-ccl"

    # c10d names every group (``_set_group_name`` at creation, ``group_name`` when
    # ``destroy_process_group(group)`` unregisters it); the C++ ProcessGroup keeps the name in
    # its backends, and a Python group has none, so the name is kept here
    def _set_group_name(self, name: str) -> None:
        self._name = name

    @property
    def group_name(self) -> str:
        return getattr(self, "_name", self._group)

    def _set_sequence_number_for_group(self) -> None:
        self._gloo._set_sequence_number_for_group()
        self._seq = self._gloo._get_sequence_number_for_group()

    def _get_sequence_number_for_group(self) -> int:
        return self._seq

    def __repr__(self) -> str:
        return f"<ProcessGroupRBLN rank {self.rank()} of {self.size()}, group {self._group}>"

    # plumbing -------------------------------------------------------------------------------
    def _where(self, op: str, tensors: list[tuple[str, torch.Tensor]], reduce_op=None):
        """``device`` / ``host`` for rbln tensors, ``None`` for CPU tensors; a mix raises."""
        devs = {t.device for _, t in tensors}
        if not tensors or all(d.type == "cpu" for d in devs):
            return None
        for name, t in tensors:
            if t.layout != torch.strided:
                raise RuntimeError(f"rbln-ccl {op}: {name} is a {t.layout} tensor; rbln-ccl "
                                   "moves dense (strided) tensors only")
            if t.device.type != "rbln":
                first = next(n for n, x in tensors if x.device.type == "rbln")
                raise RuntimeError(
                    f"rbln-ccl {op}: {name} is on {t.device} but {first} is on rbln: the "
                    f"tensors of one collective must all be on the NPU (move it there with "
                    f".to('rbln')), or all on the CPU")
        if reduce_op is not None:
            dtypes = {t.dtype for _, t in tensors}
            if dtypes != {torch.float16} or not _is_sum(reduce_op):
                return HOST         # the gloo fallback of rbln-ccl: non-fp16 or non-SUM
        return DEVICE

    def _translate(self, op: str):
        rank, timeout = self.rank(), self._timeout

        def fn(e: BaseException) -> BaseException:
            if isinstance(e, agreement.MismatchError):
                return e
            msg = str(e)
            low = msg.lower()
            if "timed out" in low or "timeout" in low:
                why = (f"timed out waiting for the other ranks (group timeout "
                       f"{timeout.total_seconds():g} s): a rank never called {op}, or is "
                       "stuck before it")
            elif "closed by peer" in low or "reset by peer" in low or "broken pipe" in low:
                why = ("a peer rank left the group (it exited or crashed; look at its output "
                       "first)")
            else:
                why = "the transport failed"
            err = dist.DistBackendError(f"rbln-ccl {op} on rank {rank}: {why}. [{msg}]")
            err.__cause__ = e
            return err
        return fn

    def _agree(self, op: str, t: torch.Tensor | None = None, root: int = agreement.NONE,
               reduce_op=None, root_name: str = "root") -> None:
        """Every rank checks that the others issue the same collective on matching tensors (one
        small all-gather of fingerprints over gloo, or a round of the group's shared memory,
        which every collective of such a group agrees through, whichever way its data moves);
        a mismatch raises on every rank alike."""
        if self._shm is not None:
            self._exchange(op, t, None, root, reduce_op, root_name)
            return
        # the first collective opens the NPUs (commits the mapping), like an allocation
        devices.commit()
        seq = self._issued
        self._issued += 1
        if self.size() == 1:
            return
        mine = agreement.fingerprint(op, t, root,
                                     _code(reduce_op) if reduce_op is not None else agreement.NONE)
        rows = torch.empty(self.size() * agreement.LENGTH, dtype=torch.int64)
        work = self._gloo._allgather_base(rows, mine, c10d.AllgatherOptions())
        try:
            work.wait()
        except Exception as e:
            raise self._translate(op)(e) from e
        agreement.compare(rows.view(self.size(), agreement.LENGTH), seq, root_name)

    def _on_shm(self, t: torch.Tensor, reduce_op=None) -> bool:
        """This collective goes through the group's shared memory (shm.py): it fits a slot,
        and a reduction is one whose result does not depend on the order the ranks' values
        are combined in (gloo's, which the shared memory's rank order would not reproduce bit
        for bit): integers, min/max, or two ranks."""
        if self._shm is None or not shm.Channel.fits(staging.nbytes(t)):
            return False
        if reduce_op is None:
            return True
        return _code(reduce_op) in shm.REDUCTIONS and not t.is_complex() and (
            self.size() == 2 or not t.is_floating_point() or _code(reduce_op) in shm.ORDERLESS)

    def _exchange(self, op: str, t: torch.Tensor | None, data: torch.Tensor | None,
                  root: int = agreement.NONE, reduce_op=None, root_name: str = "root") -> int:
        """One round of the shared memory: this rank's fingerprint and data posted, the
        others' awaited and checked (the agreement of ``_agree`` in the same round); returns
        where the round's slots are."""
        devices.commit()
        seq = self._issued
        self._issued += 1
        mine = agreement.fingerprint_values(
            op, t, root, _code(reduce_op) if reduce_op is not None else agreement.NONE)
        try:
            return self._shm.exchange(mine, data, seq, root_name)
        except agreement.MismatchError:
            raise
        except Exception as e:
            raise self._translate(op)(e) from e

    def _issue(self, op: str, result, works, st: Staging, where, nbytes: int) -> Work:
        """The Work of a collective whose transport operations are ``works``."""
        if where is not None:
            staging.record(op, where, nbytes)
        self._seq += 1
        work = Work(op, result, works, post=st.done if st.finish else None,
                    translate=self._translate(op))
        if not config.live("TORCH_RBLN_C10D_ASYNC"):
            work.wait()
        return work

    @staticmethod
    def _one(op: str, tensors) -> None:
        if len(tensors) != 1:
            raise ValueError(f"rbln-ccl {op}: expected one tensor per rank, got {len(tensors)} "
                             "(one process drives one NPU)")

    def _numel(self, op: str, what: str, t: torch.Tensor, numel: int, dtype) -> None:
        if t.numel() != numel or t.dtype != dtype:
            raise ValueError(f"rbln-ccl {op}: {what} is {t.dtype}[{t.numel()}] but must be "
                             f"{dtype}[{numel}]")

    # collectives ----------------------------------------------------------------------------
    def broadcast(self, tensors, opts=None):
        op = "broadcast"
        opts = opts if opts is not None else c10d.BroadcastOptions()
        self._one(op, tensors)
        where = self._where(op, [("tensor", tensors[0])])
        t = tensors[0]
        root = self.rank() == opts.rootRank
        if self._on_shm(t):
            st = Staging(where or DEVICE)
            cpu = st(t, READ if root else WRITE)
            parity = self._exchange(op, t, cpu if root else None, root=opts.rootRank,
                                    root_name="src")
            if not root:
                cpu.copy_(self._shm.slot(parity, opts.rootRank, cpu.dtype, cpu.numel())
                          .view(cpu.shape))
            return self._issue(op, tensors, [], st, where, staging.nbytes(t))
        self._agree(op, t, root=opts.rootRank, root_name="src")
        st = Staging(where or DEVICE)
        cpu = st.many(tensors, READ if root else WRITE)
        return self._issue(op, tensors, [self._gloo.broadcast(cpu, opts)], st, where,
                           staging.nbytes(*tensors))

    def allreduce(self, tensors, opts=None):
        op = "all_reduce"
        if opts is None:
            opts = c10d.AllreduceOptions()
        elif isinstance(opts, dist.ReduceOp) or not hasattr(opts, "reduceOp"):
            o = c10d.AllreduceOptions()
            o.reduceOp = opts
            opts = o
        self._one(op, tensors)
        where = self._where(op, [("tensor", tensors[0])], reduce_op=opts.reduceOp)
        t = tensors[0]
        if self._on_shm(t, opts.reduceOp):
            st = Staging(where or DEVICE)
            cpu = st(t, INOUT)
            parity = self._exchange(op, t, cpu, reduce_op=opts.reduceOp)
            cpu.copy_(self._shm.reduce(parity, cpu.dtype, cpu.numel(), _code(opts.reduceOp))
                      .view(cpu.shape))
            return self._issue(op, tensors, [], st, where, staging.nbytes(t))
        self._agree(op, t, reduce_op=opts.reduceOp)
        st = Staging(where or DEVICE)
        cpu = st.many(tensors, INOUT)
        return self._issue(op, tensors, [self._gloo.allreduce(cpu, opts)], st, where,
                           staging.nbytes(*tensors))

    def allgather(self, output_lists, inputs, opts=None):
        op = "all_gather"
        opts = opts if opts is not None else c10d.AllgatherOptions()
        self._one(op, inputs)
        if len(output_lists) != 1 or len(output_lists[0]) != self.size():
            raise ValueError(f"rbln-ccl {op}: the output list must hold one tensor per rank "
                             f"({self.size()}), got {len(output_lists[0]) if output_lists else 0}")
        inp, outs = inputs[0], output_lists[0]
        for i, o in enumerate(outs):
            self._numel(op, f"output[{i}]", o, inp.numel(), inp.dtype)
        where = self._where(op, [("input", inp)] + [(f"output[{i}]", o) for i, o in enumerate(outs)])
        if self._on_shm(inp):
            st = Staging(where or DEVICE)
            cin = st(inp, READ)
            couts = st.many(outs, WRITE)
            parity = self._exchange(op, inp, cin)
            for o, s in zip(couts, self._shm.slots(parity, cin.dtype, cin.numel())):
                o.copy_(s.view(o.shape))
            return self._issue(op, output_lists, [], st, where, staging.nbytes(*outs))
        self._agree(op, inp)
        st = Staging(where or DEVICE)
        cin = st.many(inputs, READ)
        couts = [st.many(outs, WRITE)]
        return self._issue(op, output_lists, [self._gloo.allgather(couts, cin, opts)], st,
                           where, staging.nbytes(*outs))

    def all_gather_single(self, output, input, opts=None):
        op = "all_gather_into_tensor"
        opts = opts if opts is not None else c10d.AllgatherOptions()
        self._numel(op, "the output", output, input.numel() * self.size(), input.dtype)
        where = self._where(op, [("input", input), ("output", output)])
        st = Staging(where or DEVICE)
        if self._on_shm(input):
            cin = st(input, READ)
            cout = st(output, WRITE)
            parity = self._exchange(op, input, cin)
            torch.stack(self._shm.slots(parity, cin.dtype, cin.numel()),
                        out=cout.view(self.size(), cin.numel()))
            return self._issue(op, output, [], st, where, staging.nbytes(output))
        self._agree(op, input)
        cin = st(input, READ)
        cout = st(output, WRITE)
        return self._issue(op, output, [self._gloo._allgather_base(cout, cin, opts)], st,
                           where, staging.nbytes(output))

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        op = "all_gather_into_tensor_coalesced"
        opts = opts if opts is not None else c10d.AllgatherOptions()
        if len(outputs) != len(inputs):
            raise ValueError(f"rbln-ccl {op}: {len(outputs)} outputs for {len(inputs)} inputs")
        pairs = []
        for i, (o, x) in enumerate(zip(outputs, inputs)):
            self._numel(op, f"output[{i}]", o, x.numel() * self.size(), x.dtype)
            pairs += [(f"input[{i}]", x), (f"output[{i}]", o)]
        where = self._where(op, pairs)
        for x in inputs:
            self._agree("all_gather_into_tensor", x)
        st = Staging(where or DEVICE)
        cins = st.many(inputs, READ)         # inputs first: one may be a view of an output
        couts = st.many(outputs, WRITE)
        works = [self._gloo._allgather_base(o, x, opts) for o, x in zip(couts, cins)]
        return self._issue(op, outputs, works, st, where, staging.nbytes(*outputs))

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def allgather_coalesced(self, output_lists, inputs, opts=None):
        op = "all_gather_coalesced"
        opts = opts if opts is not None else c10d.AllgatherOptions()
        if len(output_lists) != self.size() or any(len(l) != len(inputs) for l in output_lists):
            raise ValueError(f"rbln-ccl {op}: expected {self.size()} output lists of "
                             f"{len(inputs)} tensors (one list per rank)")
        for r, l in enumerate(output_lists):
            for i, (o, x) in enumerate(zip(l, inputs)):
                self._numel(op, f"output[{r}][{i}]", o, x.numel(), x.dtype)
        where = self._where(op, [(f"input[{i}]", x) for i, x in enumerate(inputs)] +
                            [(f"output[{r}][{i}]", o) for r, l in enumerate(output_lists)
                             for i, o in enumerate(l)])
        for x in inputs:
            self._agree(op, x)
        st = Staging(where or DEVICE)
        cin = st.many(inputs, READ)
        couts = [st.many(l, WRITE) for l in output_lists]
        return self._issue(op, output_lists, [self._gloo.allgather_coalesced(couts, cin, opts)],
                           st, where, staging.nbytes(*[o for l in output_lists for o in l]))

    def scatter(self, outputs, input_lists, opts=None):
        op = "scatter"
        opts = opts if opts is not None else c10d.ScatterOptions()
        self._one(op, outputs)
        out = outputs[0]
        root = self.rank() == opts.rootRank
        ins = input_lists[0] if root and input_lists else []
        if root:
            if len(ins) != self.size():
                raise ValueError(f"rbln-ccl {op}: the source rank must pass one tensor per rank "
                                 f"({self.size()}), got {len(ins)}")
            for i, x in enumerate(ins):
                self._numel(op, f"scatter_list[{i}]", x, out.numel(), out.dtype)
        where = self._where(op, [("output", out)] + [(f"scatter_list[{i}]", x)
                                                     for i, x in enumerate(ins)])
        self._agree(op, out, root=opts.rootRank, root_name="src")
        st = Staging(where or DEVICE)
        cin = [st.many(ins, READ)] if root else []
        cout = [st(out, WRITE)]
        return self._issue(op, outputs, [self._gloo.scatter(cout, cin, opts)], st, where,
                           staging.nbytes(out) * self.size())

    def reduce_scatter(self, outputs, input_lists, opts=None):
        op = "reduce_scatter"
        opts = opts if opts is not None else c10d.ReduceScatterOptions()
        self._one(op, outputs)
        out = outputs[0]
        ins = input_lists[0] if input_lists else []
        if len(input_lists) != 1 or len(ins) != self.size():
            raise ValueError(f"rbln-ccl {op}: the input list must hold one tensor per rank "
                             f"({self.size()}), got {len(ins)}")
        for i, x in enumerate(ins):
            self._numel(op, f"input_list[{i}]", x, out.numel(), out.dtype)
        where = self._where(op, [("output", out)] + [(f"input_list[{i}]", x)
                                                     for i, x in enumerate(ins)],
                            reduce_op=opts.reduceOp)
        self._agree(op, out, reduce_op=opts.reduceOp)
        st = Staging(where or DEVICE)
        cin = [st.many(ins, READ)]
        cout = [st(out, WRITE)]
        return self._issue(op, outputs, [self._gloo.reduce_scatter(cout, cin, opts)], st,
                           where, staging.nbytes(*ins))

    def reduce_scatter_single(self, output, input, opts=None):
        op = "reduce_scatter_tensor"
        opts = opts if opts is not None else c10d.ReduceScatterOptions()
        self._numel(op, "the input", input, output.numel() * self.size(), output.dtype)
        where = self._where(op, [("output", output), ("input", input)], reduce_op=opts.reduceOp)
        st = Staging(where or DEVICE)
        if self._on_shm(input, opts.reduceOp):
            cin = st(input, READ)
            cout = st(output, WRITE)
            parity = self._exchange(op, output, cin, reduce_op=opts.reduceOp)
            n = cout.numel()
            mine = slice(self.rank() * n, (self.rank() + 1) * n)
            cout.copy_(self._shm.reduce(parity, cin.dtype, cin.numel(), _code(opts.reduceOp),
                                        mine).view(cout.shape))
            return self._issue(op, output, [], st, where, staging.nbytes(input))
        self._agree(op, output, reduce_op=opts.reduceOp)
        cin = st(input, READ)
        cout = st(output, WRITE)
        return self._issue(op, output, [self._gloo._reduce_scatter_base(cout, cin, opts)], st,
                           where, staging.nbytes(input))

    _reduce_scatter_base = reduce_scatter_single

    # point to point: the sender's fingerprint travels ahead of the data; the receiver posts
    # the data's receive once it checked it. Neither call blocks: dist.send / dist.recv wait on
    # the Work themselves, isend / irecv leave it to the caller (gloo pairs a send with its
    # receive only once both are posted, so blocking here could deadlock a ring of irecv/isend)
    def send(self, tensors, dst: int, tag: int = 0):
        op = "send"
        self._one(op, tensors)
        where = self._where(op, [("tensor", tensors[0])])
        devices.commit()
        t = tensors[0]
        header = agreement.fingerprint("send", t, root=t.numel() * t.element_size())
        st = Staging(where or DEVICE)
        cpu = st.many(tensors, READ)
        works = [self._gloo.send([header], dst, tag), self._gloo.send(cpu, dst, tag)]
        if where is not None:
            staging.record(op, where, staging.nbytes(t))
        self._seq += 1
        return Work(op, tensors, works, auto=False, translate=self._translate(op))

    def recv(self, tensors, src: int, tag: int = 0):
        op = "recv"
        self._one(op, tensors)
        t = tensors[0]
        where = self._where(op, [("tensor", t)])
        devices.commit()
        if where is not None:
            staging.record(op, where, staging.nbytes(t))
        self._seq += 1
        key = (src, tag)
        prev = self._inbox.get(key)
        r = _Receive(self._gloo, tensors, where, src, tag, self.rank(),
                     prev if prev is not None and not prev.posted else None)
        self._inbox[key] = r
        return Work(op, tensors, [r], post=r.finish, auto=False, translate=self._translate(op))

    def barrier(self, opts=None):
        # the agreement step is an all-gather among every rank: a barrier of its own
        if self._shm is not None:
            self._exchange("barrier", None, None)
        else:
            self._agree("barrier")
        self._seq += 1
        return Work("barrier", [])

    # outside the reference's list -----------------------------------------------------------
    def _unsupported(self, op: str, hint: str):
        raise RuntimeError(f"rbln-ccl does not support {op}; it runs {SUPPORTED}. {hint} "
                           "(For CPU tensors, a gloo group works: dist.new_group(backend='gloo').)")

    def reduce(self, *args, **kwargs):
        self._unsupported("reduce", "Use all_reduce and read the result on the destination rank.")

    def gather(self, *args, **kwargs):
        self._unsupported("gather", "Use all_gather and keep the result on the destination rank.")

    def alltoall(self, *args, **kwargs):
        self._unsupported("all_to_all", "Exchange with send/recv pairs.")

    def all_to_all_single(self, *args, **kwargs):
        self._unsupported("all_to_all_single", "Exchange with send/recv pairs.")

    alltoall_base = all_to_all_single

    def allreduce_coalesced(self, *args, **kwargs):
        self._unsupported("all_reduce_coalesced", "Call all_reduce once per tensor.")

    def reduce_scatter_single_coalesced(self, *args, **kwargs):
        self._unsupported("reduce_scatter_tensor_coalesced",
                          "Call reduce_scatter_tensor once per tensor.")

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def recv_anysource(self, *args, **kwargs):
        self._unsupported("recv from any source", "Name the source rank: dist.recv(t, src=...).")

    def monitored_barrier(self, *args, **kwargs):
        self._unsupported("monitored_barrier", "Use barrier().")


class _Receive:
    """One ``recv``: the sender's fingerprint, then its data, both on gloo's (src, tag) channel,
    where gloo hands each arriving message to the receive posted first. The data's receive is
    posted once the fingerprint arrived and matched, so a second ``irecv`` from the same source
    posts its fingerprint's receive only after the first posted its data's (or the second
    fingerprint would take the first's data: vLLM's pipeline stages receive the hidden states
    and the residual back to back). Nothing blocks in ``recv`` itself: a receive waiting for its
    predecessor posts it when it is waited on."""

    def __init__(self, gloo, tensors, where, src: int, tag: int, me: int,
                 prev: "_Receive | None"):
        self._gloo, self._tensors, self._where = gloo, tensors, where
        self._src, self._tag, self._me = src, tag, me
        self._prev = prev
        self._lock = threading.Lock()
        self._header = torch.empty(agreement.LENGTH, dtype=torch.int64)
        self._header_work = None
        self._data_work = None
        self._staging: Staging | None = None
        self._error: BaseException | None = None
        self.posted = False                 # the data's receive is posted (or drained)
        if prev is None:
            self._header_work = gloo.recv([self._header], src, tag)

    def post(self) -> None:
        """Receive and check the fingerprint, then post the data's receive (once)."""
        with self._lock:
            if self.posted:
                return
            try:
                if self._header_work is None:
                    self._prev.post()
                    self._prev = None
                    self._header_work = self._gloo.recv([self._header], self._src, self._tag)
                self._header_work.wait()
                t = self._tensors[0]
                try:
                    agreement.compare_p2p(agreement.fingerprint("send", t), self._header,
                                          self._src, self._me)
                except agreement.MismatchError as e:
                    # take the sender's bytes anyway, so the pair stays usable, then report
                    drain = torch.empty(int(self._header[4 + agreement.MAX_DIMS]),
                                        dtype=torch.uint8)
                    self._gloo.recv([drain], self._src, self._tag).wait()
                    self._error = e
                    return
                self._staging = Staging(self._where or DEVICE)
                self._data_work = self._gloo.recv(self._staging.many(self._tensors, WRITE),
                                                  self._src, self._tag)
            finally:
                self.posted = True

    # Work waits on its handles (this one: the fingerprint and the data's receive posted) and
    # then runs ``finish``
    def wait(self, timeout=None) -> bool:
        self.post()
        return True

    def finish(self) -> None:
        if self._error is not None:
            raise self._error
        if self._data_work is None:
            raise RuntimeError("rbln-ccl recv: the receive was never posted")
        self._data_work.wait()
        self._staging.done()


def create(opts, backend_options=None) -> ProcessGroupRBLN:
    """The factory ``register_backend`` holds (extended API: c10d's backend options)."""
    return ProcessGroupRBLN(opts.store, opts.group_rank, opts.group_size, opts.timeout,
                            str(opts.group_id))
