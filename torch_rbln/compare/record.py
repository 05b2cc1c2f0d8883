"""``torch.rbln.compare.record(path)``: write a run's ops and module outputs to a directory, to
compare it later with another run's (``python -m torch_rbln.compare A B``).

It sees what a compare region sees (``observe.py``), on any device (cpu, rbln, cuda), and
keeps, per op and per module call, a device-neutral summary of each floating result
(``stats.summaries``: min, max, NaN/Inf count, 64 elements at fixed positions), and with
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


HOLD = 1 << 24      # elements of results held for their summaries before they are taken

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


def _s(v) -> str:
    return "null" if v is None else _str(v)


def _i(v) -> str:
    return "null" if v is None else str(int(v))


def _num(v: float) -> str:
    return json.dumps(v) if not math.isfinite(v) else repr(v)


def _row(t: torch.Tensor, summary: dict, at: int, n: int) -> str:
    return (f'{{"shape": {list(t.shape)}, "dtype": "{region.dtype_name(t.dtype)}", '
            f'"numel": {summary["numel"]}, "min": {_num(summary["min"])}, '
            f'"max": {_num(summary["max"])}, "nonfinite": {summary["nonfinite"]}, '
            f'"sample": [{at}, {n}]}}')


class Recorder(Region):
    """A record region; use as ``with torch.rbln.compare.record(path):``.

    Each result is reduced as it is made (``stats.reduce``: min, max and samples, while it is in
    cache) and held; what is held is read back and written in batches (``stats.summaries``):
    before an op writes memory (a result's values are as they were made), when :data:`HOLD`
    elements are held, and when the region closes, also by an exception."""

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
        # ("op", Op, slots) | ("module", seq, Call, ops_to, slots), in the order they finished;
        # a slot per distinct result held: id(result) -> slot, and the result, its host view
        # and its reduction by slot
        self._held: list = []
        self._slot: dict[int, int] = {}
        self._results: list = []
        self._hosts: list = []
        self._reduced: list = []
        self._held_numel = 0
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
            if self._index is not None and self._held:
                self._take()
        finally:
            self._held, self._slot, self._results, self._hosts, self._reduced = [], {}, [], [], []
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
        if self._held:
            self._take()

    def op_after(self, info, func, args, kwargs, out, token) -> None:
        outs = _floating(out)
        if outs:
            self.count["ops"] += 1
            self._hold(["op", info], outs)

    def module_before(self, call, args, kwargs, outermost: bool):
        return self._obs.seq if self._obs is not None else 0

    def module_after(self, call, args, kwargs, output) -> None:
        outs = _floating(output)
        if not outs:
            return
        seq = self._modules
        self._modules += 1
        self.count["modules"] += 1
        with self._obs.pause():
            self._hold(["module", seq, call, self._obs.seq], outs)

    def _hold(self, item: list, outs: list) -> None:
        slots = []
        for t in outs:
            i = self._slot.get(id(t))
            if i is None:       # a module output is often its last op's result: reduced once
                i = self._slot[id(t)] = len(self._results)
                h = gold.host(t) if t.device.type == "rbln" else t.detach()
                self._results.append(t)
                self._hosts.append(h)
                self._reduced.append(stats.reduce(h))
                self._held_numel += t.numel()
            slots.append(i)
        item.append(slots)
        self._held.append(item)
        if self._held_numel > HOLD:
            self._take()

    def _take(self) -> None:
        """Read back what is held and write its lines."""
        items, ts, hosts = self._held, self._results, self._hosts
        got = stats.summaries(hosts, self._reduced)
        self._held, self._slot, self._results, self._hosts, self._reduced = [], {}, [], [], []
        self._held_numel = 0
        for t in ts:
            self._devices.add(t.device.type)
            self._dtypes.add(region.dtype_name(t.dtype))
        lines, samples = [], []
        for item in items:
            rows = []
            for i in item[-1]:
                summary, sample = got[i]
                n = len(sample) // 4
                rows.append(_row(ts[i], summary, self._offset, n))
                self._offset += n
                samples.append(sample)
            outputs = ", ".join(rows)
            if item[0] == "op":
                info = item[1]
                line = (f'{{"kind": "op", "seq": {info.seq}, "op": {_str(info.op)}, '
                        f'"phase": "{info.phase}", "route": {_str(info.route)}, '
                        f'"module": {_s(info.module)}, "module_call": {_i(info.module_call)}, '
                        f'"index": {info.index}, "node": {_s(info.node)}, '
                        f'"at": {_s(site_text(info.site))}, "outputs": [{outputs}]')
                name = f"op-{info.seq}.pt"
            else:
                _, seq, call, ops_to, _ = item
                line = (f'{{"kind": "module", "seq": {seq}, "path": {_str(call.path)}, '
                        f'"class": {_str(call.cls)}, "call": {call.call}, '
                        f'"at": {_s(site_text(call.site))}, "ops_from": {_i(call.token)}, '
                        f'"ops_to": {ops_to}, "outputs": [{outputs}]')
                name = f"module-{seq}.pt"
            if self.tensors:
                torch.save([hosts[i].cpu().clone() for i in item[-1]],
                           self.path / "tensors" / name)
                line += f', "tensors": "{name}"'
            lines.append(line + "}\n")
        with self._lock:
            self._samples.write(b"".join(samples))
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
