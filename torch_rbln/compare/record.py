"""``torch.rbln.compare.record(path)``: write a run's ops and module outputs to a directory, to
compare it later with another run's (``python -m torch_rbln.compare A B``).

It sees what a compare region sees (``observe.py``), on any device (cpu, rbln, cuda), and
keeps, per op and per module call, a device-neutral summary of each floating result
(``stats.reduce``: min, max, NaN/Inf count, 64 elements at fixed positions), and with
``tensors=True`` the results themselves. No golden run; a module output that is its last op's
result is summarized once.

The directory::

    meta.json       format, torch and torch_rbln versions, devices and dtypes seen, command
    index.jsonl     one JSON object per line: {"kind": "op" | "module", ...} in the order
                    they finished (ops: seq, op, phase, route, module, module_call, index,
                    node, at; modules: seq, path, class, call, at, ops_from, ops_to), each
                    with "outputs": [{"shape", "dtype", "numel", "min", "max",
                    "nonfinite", "sample": [offset, count]}] and, with tensors, "tensors":
                    a file name
    samples.f32     the sampled elements, float32 little-endian, at each output's offset
    tensors/        op-<seq>.pt, module-<seq>.pt: the results as CPU tensors (torch.save)

Lines are written in batches as the run goes (``Recorder``) and at the region's exit, also
when it exits by an exception, so a run that fails keeps what it recorded.
"""

from __future__ import annotations

import json
import math
import os
import sys
import threading
from pathlib import Path

import numpy as np
import torch

from ..version import __version__
from . import golden as gold
from . import region, stats
from ..user_frames import site_text
from .observe import Observer, Region, tensors_of

FORMAT = "torch_rbln.compare.record/1"


BATCH = 1024        # entries whose lines are written together

_str = json.encoder.c_encode_basestring_ascii or json.encoder.py_encode_basestring_ascii


def _floating(x) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x] if x.is_floating_point() else []
    return [t for t in tensors_of(x) if t.is_floating_point()]


def _any_floating(args, kwargs) -> bool:
    """Does an op read a floating tensor? (An op's operands are tensors, lists of them and
    plain values.)"""
    for vs in (args, kwargs.values()):
        for v in vs:
            if isinstance(v, torch.Tensor):
                if v.is_floating_point():
                    return True
            elif isinstance(v, (list, tuple)):
                if any(isinstance(t, torch.Tensor) and t.is_floating_point() for t in v):
                    return True
    return False


_dtype_names: dict = {}


def _dtype_name(dtype: torch.dtype) -> str:
    name = _dtype_names.get(dtype)
    if name is None:
        name = _dtype_names[dtype] = region.dtype_name(dtype)
    return name


def _s(v) -> str:
    return "null" if v is None else _str(v)


def _i(v) -> str:
    return "null" if v is None else str(int(v))


def _num(v: float) -> str:
    return json.dumps(v) if not math.isfinite(v) else repr(v)


class Recorder(Region):
    """A record region; use as ``with torch.rbln.compare.record(path):``.

    Each result is summarized as it is made (``stats.reduce``: one pass while it is still in
    cache; nothing of it is held after), its samples read back and its lines written in
    batches: every :data:`BATCH` entries and when the region closes, also by an exception."""

    module_kwargs = False

    def __init__(self, path, tensors: bool = False):
        self.path = Path(path)
        self.tensors = bool(tensors)
        self._index = None
        self._samples = None
        self._offset = 0
        self._devices: set = set()
        self._dtypes: set = set()
        self._modules = 0
        self._lock = threading.Lock()
        # [entry line's head, [(shape, dtype, summary, samples), ...]], in the order they
        # finished
        self._pending: list = []
        # id(result) -> (result, its row) for the last op's results and the module calls that
        # returned them since: a module output is mostly one of those, summarized once
        self._recent: dict[int, tuple] = {}
        self.count = {"ops": 0, "modules": 0}

    # lifecycle ------------------------------------------------------------------------------
    def _open(self, observer: Observer) -> None:
        if self.path.exists() and (not self.path.is_dir() or any(self.path.iterdir())):
            raise FileExistsError(f"{self.path} exists and is not an empty directory: a record "
                                  "goes to a new directory (remove it, or choose another path)")
        self.path.mkdir(parents=True, exist_ok=True)
        if self.tensors:
            (self.path / "tensors").mkdir()
        self._write_meta()
        self._index = open(self.path / "index.jsonl", "w")
        self._samples = open(self.path / "samples.f32", "wb")
        self._offset = 0

    def _close(self) -> None:
        try:
            if self._index is not None and self._pending:
                self._write()
        finally:
            self._pending, self._recent = [], {}
            if self._samples is not None:
                self._samples.close()
                self._samples = None
            if self._index is not None:
                self._index.close()
                self._index = None
                self._write_meta()

    def _write_meta(self) -> None:
        meta = {"format": FORMAT, "torch": torch.__version__, "torch_rbln": __version__,
                "devices": sorted(self._devices), "dtypes": sorted(self._dtypes),
                "tensors": self.tensors, "ops": self.count["ops"],
                "modules": self.count["modules"], "command": [sys.executable, *sys.argv]}
        (self.path / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")

    # the sink -------------------------------------------------------------------------------
    def op_before(self, func, args, kwargs, wpos, wkw):
        return True if _any_floating(args, kwargs) else None

    def op_writes(self) -> None:
        self._recent = {}       # what they hold may change

    def op_after(self, info, func, args, kwargs, out, token) -> None:
        outs = _floating(out)
        if not outs:
            return
        self.count["ops"] += 1
        self._recent = {}
        head = (f'{{"kind": "op", "seq": {info.seq}, "op": {_str(info.op)}, '
                f'"phase": "{info.phase}", "route": {_str(info.route)}, '
                f'"module": {_s(info.module)}, "module_call": {_i(info.module_call)}, '
                f'"index": {info.index}, "node": {_s(info.node)}, ')
        self._add(head, info.site, outs, f"op-{info.seq}.pt")

    def module_before(self, call, args, kwargs, outermost: bool):
        return self._obs.seq if self._obs is not None else 0

    def module_after(self, call, args, kwargs, output) -> None:
        outs = _floating(output)
        if not outs:
            return
        seq = self._modules
        self._modules += 1
        self.count["modules"] += 1
        head = (f'{{"kind": "module", "seq": {seq}, "path": {_str(call.path)}, '
                f'"class": {_str(call.cls)}, "call": {call.call}, '
                f'"ops_from": {_i(call.token)}, "ops_to": {self._obs.seq}, ')
        if self.tensors or not all(self._recent.get(id(t), (None,))[0] is t for t in outs):
            with self._obs.pause():     # reductions (and saves) run torch ops in a hook
                self._add(head, call.site, outs, f"module-{seq}.pt")
        else:
            self._add(head, call.site, outs, None)

    def _add(self, head: str, site: tuple, outs: list, name: str | None) -> None:
        rows, hosts = [], []
        for t in outs:
            got = self._recent.get(id(t))
            if got is None or got[0] is not t:
                h = gold.host(t) if t.device.type == "rbln" else t.detach()
                hosts.append(h)
                got = self._recent[id(t)] = (t, (list(t.shape), _dtype_name(t.dtype),
                                                 *stats.reduce(h)))
                self._devices.add(t.device.type)
                self._dtypes.add(got[1][1])
            elif self.tensors:
                hosts.append(gold.host(t) if t.device.type == "rbln" else t.detach())
            rows.append(got[1])
        if self.tensors:
            torch.save([h.cpu().clone() for h in hosts], self.path / "tensors" / name)
            head += f'"tensors": "{name}", '
        self._pending.append((head, site, rows))
        if len(self._pending) >= BATCH:
            self._write()

    def _write(self) -> None:
        """Read back the pending entries' samples and write their lines."""
        pending, self._pending = self._pending, []
        got = stats.read_samples([row[3] for _, _, rows in pending for row in rows])
        lines, i = [], 0
        with self._lock:
            for head, site, rows in pending:
                outputs = []
                for shape, dtype, summary, _ in rows:
                    n = len(got[i]) // 4
                    outputs.append(
                        f'{{"shape": {shape}, "dtype": "{dtype}", "numel": {summary["numel"]}, '
                        f'"min": {_num(summary["min"])}, "max": {_num(summary["max"])}, '
                        f'"nonfinite": {summary["nonfinite"]}, "sample": [{self._offset}, {n}]}}')
                    self._offset += n
                    i += 1
                lines.append(f'{head}"at": {_s(site_text(site))}, '
                             f'"outputs": [{", ".join(outputs)}]}}\n')
            self._samples.write(b"".join(got))
            self._index.write("".join(lines))


def record(path, tensors: bool = False) -> Recorder:
    """A region that writes each op's and module call's results (summaries; with
    ``tensors=True`` the tensors too) to the new directory ``path``, for
    ``python -m torch_rbln.compare A B``."""
    return Recorder(path, tensors)


class Record:
    """A record read back: ``meta``, ``ops`` and ``modules`` (the index's entries)."""

    def __init__(self, path):
        self.path = Path(path)
        meta_file = self.path / "meta.json"
        if not meta_file.is_file():
            raise FileNotFoundError(f"{self.path} is not a record (no meta.json): write one with "
                                    "torch.rbln.compare.record(path)")
        self.meta = json.loads(meta_file.read_text())
        if self.meta.get("format") != FORMAT:
            raise ValueError(f"{self.path}: record format {self.meta.get('format')!r}, this "
                             f"version reads {FORMAT!r}")
        self.ops: list[dict] = []
        self.modules: list[dict] = []
        self._samples = torch.from_numpy(np.fromfile(self.path / "samples.f32", dtype="<f4"))
        index = self.path / "index.jsonl"
        with open(index) as f:
            for line in f:
                if line.strip():
                    e = json.loads(line)
                    (self.ops if e["kind"] == "op" else self.modules).append(e)

    def sample(self, output: dict) -> torch.Tensor:
        """The sampled elements of one output (``stats.positions``), float32."""
        at, n = output["sample"]
        return self._samples[at:at + n]

    def tensors(self, entry: dict) -> list[torch.Tensor] | None:
        name = entry.get("tensors")
        if not name:
            return None
        return torch.load(os.path.join(self.path, "tensors", name), weights_only=True)

    def describe(self) -> str:
        dev = "/".join(self.meta.get("devices") or ["-"])
        dt = "/".join(self.meta.get("dtypes") or ["-"])
        return f"{self.path.name} ({dev}, {dt})"


def load(path) -> Record:
    """Read the record written to ``path``."""
    return Record(path)
