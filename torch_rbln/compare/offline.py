"""Two records compared: the same report as a live region, run B against reference run A.

Module calls are paired by path and call index. Ops are paired within each module call (and
phase) by op sequence: the two op lists are aligned on (op family, result size), so a device
that runs ``aten::linear`` where the CPU runs ``aten::addmm``, or that fuses attention, still
pairs the ops around it; ops without a partner are counted as not compared. Each pair is
judged against the tolerance of the least precise dtype either run computed in (an fp32 op of
an fp16 model carries the fp16 errors of its inputs): from the tensors where both records hold
them, else from the summaries' samples (64 elements at the same positions) and their NaN/Inf
counts. An op's error here is accumulated, as a module's: run B's op had
run B's inputs.
"""

from __future__ import annotations

import difflib

import torch

from . import hints, report, stats
from .record import Record
from .region import Tolerances

OP_ERROR = "B against A, accumulated: each run's op on its own inputs"
MODULE_ERROR = "B against A: each run's module output"

# op packets that compute the same thing under other names on other devices or routes
FAMILIES = {
    "linear": "matmul", "addmm": "matmul", "mm": "matmul", "bmm": "matmul", "matmul": "matmul",
    "baddbmm": "matmul",
    "scaled_dot_product_attention": "sdpa", "_scaled_dot_product_fused_attention_overrideable":
    "sdpa", "_scaled_dot_product_flash_attention_for_cpu": "sdpa",
    "_scaled_dot_product_flash_attention": "sdpa", "_scaled_dot_product_efficient_attention":
    "sdpa", "_scaled_dot_product_attention_math": "sdpa",
    "_to_copy": "copy", "copy": "copy", "_softmax": "softmax", "_log_softmax": "log_softmax",
}


def family(op: str) -> str:
    p = hints.packet(op)
    return FAMILIES.get(p, p)


def _dtype(name: str) -> torch.dtype:
    return getattr(torch, name)


def _coarser(a: str, b: str) -> torch.dtype:
    """The less precise of two dtype names."""
    da, db = _dtype(a), _dtype(b)
    return da if torch.finfo(da).eps >= torch.finfo(db).eps else db


class _Pairing:
    def __init__(self, a: Record, b: Record, tol: Tolerances):
        self.a, self.b, self.tol = a, b, tol
        self.dtypes: set = set()
        # the least precise dtype either run computed in: an fp32 op of an fp16 model carries
        # the fp16 errors of its inputs, so it is judged at fp16's tolerance
        names = [d for d in (*a.meta.get("dtypes", ()), *b.meta.get("dtypes", ()))
                 if _dtype(d).is_floating_point]
        self.run_dtype = None
        for d in names:
            self.run_dtype = _dtype(d) if self.run_dtype is None else _coarser(
                d, str(self.run_dtype).removeprefix("torch."))

    def errors(self, ea: dict, eb: dict) -> tuple[dict, str] | None:
        oa, ob = ea["outputs"], eb["outputs"]
        if len(oa) != len(ob) or any(x["numel"] != y["numel"] for x, y in zip(oa, ob)):
            return None
        dtype = self.run_dtype or _coarser(oa[0]["dtype"], ob[0]["dtype"])
        self.dtypes.add(dtype)
        atol, rtol = self.tol.of(dtype)
        ta, tb = self.a.tensors(ea), self.b.tensors(eb)
        if ta is not None and tb is not None:
            e = stats.errors(tb, ta, atol, rtol)
        else:
            es = [stats.sampled_errors(y, x, self.b.sample(y), self.a.sample(x), atol, rtol)
                  for x, y in zip(oa, ob)]
            e = max(es, key=lambda x: (x["worst"], x["max_abs"]))
            e["numel"] = sum(x["numel"] for x in es)
            e["outside"] = sum(x["outside"] for x in es)
        return e, str(dtype).removeprefix("torch.")


def _groups(ops: list[dict]) -> dict:
    out: dict = {}
    for e in ops:
        out.setdefault((e["phase"], e["module"], e["module_call"]), []).append(e)
    return out


def _token(e: dict) -> tuple:
    return family(e["op"]), tuple(o["numel"] for o in e["outputs"])


def compare_records(a, b, *, rtol=None, atol=None) -> dict:
    """The report dump (``report.build``) of record ``b`` against reference record ``a``
    (paths or :class:`~torch_rbln.compare.record.Record`)."""
    a = a if isinstance(a, Record) else Record(a)
    b = b if isinstance(b, Record) else Record(b)
    p = _Pairing(a, b, Tolerances(atol, rtol))
    skipped_ops: dict[str, int] = {}
    skipped_mods: dict[str, int] = {}

    def skip(table, why, n=1):
        if n:
            table[why] = table.get(why, 0) + n

    ops = []
    ga = _groups(a.ops)
    for key, eb_list in _groups(b.ops).items():
        ea_list = ga.pop(key, [])
        sm = difflib.SequenceMatcher(None, [_token(e) for e in ea_list],
                                     [_token(e) for e in eb_list], autojunk=False)
        paired = 0
        for block in sm.get_matching_blocks():
            for k in range(block.size):
                ea, eb = ea_list[block.a + k], eb_list[block.b + k]
                got = p.errors(ea, eb)
                if got is None:
                    skip(skipped_ops, "results differ in size")
                    continue
                e, dtype = got
                paired += 1
                entry = {k2: eb.get(k2) for k2 in ("seq", "op", "phase", "route", "module",
                                                     "module_call", "index", "node")}
                entry.update(at=eb.get("at"), dtype=dtype,
                             shape=eb["outputs"][0]["shape"], **e)
                entry["reference_op"] = ea["op"]
                entry["diverged"] = stats.diverged(e)
                entry["hint"] = hints.for_op(eb["op"], eb["outputs"][0]["dtype"], e, None) \
                    if entry["diverged"] else None
                ops.append(entry)
        skip(skipped_ops, "only in B", len(eb_list) - paired)
        skip(skipped_ops, "only in A", len(ea_list) - paired)
    skip(skipped_ops, "only in A", sum(len(v) for v in ga.values()))
    ops.sort(key=lambda e: e["seq"])
    bad_seqs = [e["seq"] for e in ops if e["diverged"]]
    op_hints = {e["seq"]: e["hint"] for e in ops if e["hint"]}

    modules = []
    by_key = {(e["path"], e["call"]): e for e in a.modules}
    for eb in b.modules:
        ea = by_key.pop((eb["path"], eb["call"]), None)
        if ea is None:
            skip(skipped_mods, "only in B")
            continue
        got = p.errors(ea, eb)
        if got is None:
            skip(skipped_mods, "outputs differ in size")
            continue
        e, dtype = got
        entry = {"seq": len(modules), "path": eb["path"], "class": eb["class"],
                 "call": eb["call"], "at": eb.get("at"), "dtype": dtype,
                 "shape": eb["outputs"][0]["shape"], **e}
        entry["first_op"] = next((s for s in bad_seqs
                                  if eb["ops_from"] <= s < eb["ops_to"]), None)
        entry["diverged"] = stats.diverged(e)
        entry["hint"] = (hints.for_module(eb["class"], eb["outputs"][0]["dtype"], e)
                         or op_hints.get(entry["first_op"])) if entry["diverged"] else None
        modules.append(entry)
    skip(skipped_mods, "only in A", len(by_key))
    return report.build(
        reference=f"B {b.describe()} against A {a.describe()}",
        tolerances=p.tol.table(sorted(p.dtypes, key=str)), ops=ops, modules=modules,
        skipped={"ops": skipped_ops, "modules": skipped_mods}, wall_ns=0,
        op_error=OP_ERROR, module_error=MODULE_ERROR)

