"""``torch.rbln.compare.record(path)``: write a run's ops and module outputs to a directory, to
compare it later with another run's (``python -m torch_rbln.compare A B``).

It sees what a compare region sees (``observe.py``), on any device (cpu, rbln, cuda), and
keeps, per op and per module call, a device-neutral summary of each floating result
(``stats.summary``: min, max, NaN/Inf count, 64 elements at fixed positions), and with
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

Lines are written as the run goes, so a run that fails keeps what it recorded.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import weakref
from pathlib import Path

import numpy as np
import torch

from ..version import __version__
from . import golden as gold
from . import region, stats
from .observe import Observer, Region, storage_key, tensors_of

FORMAT = "torch_rbln.compare.record/1"


def _floating(x) -> list[torch.Tensor]:
    return [t for t in tensors_of(x) if t.is_floating_point()]


class Recorder(Region):
    """A record region; use as ``with torch.rbln.compare.record(path):``."""

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
        self._last: dict[int, tuple] = {}   # id -> (weakref, memory, writes, summary)
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
        return True if any(t.is_floating_point() for t in tensors_of((args, kwargs))) else None

    def op_after(self, info, func, args, kwargs, out, token) -> None:
        outs = _floating(out)
        if not outs:
            return
        entry = {"kind": "op", "seq": info.seq, "op": info.op, "phase": info.phase,
                 "route": info.route, "module": info.module, "module_call": info.module_call,
                 "index": info.index, "node": info.node, "at": info.site}
        self._write(entry, outs, f"op-{info.seq}.pt")
        self.count["ops"] += 1

    def module_before(self, call, args, kwargs, outermost: bool):
        return self._obs.seq if self._obs is not None else 0

    def module_after(self, call, args, kwargs, output) -> None:
        outs = _floating(output)
        if not outs:
            return
        seq = self._modules
        self._modules += 1
        entry = {"kind": "module", "seq": seq, "path": call.path, "class": call.cls,
                 "call": call.call, "at": call.site, "ops_from": call.token,
                 "ops_to": self._obs.seq if self._obs is not None else 0}
        self._write(entry, outs, f"module-{seq}.pt")
        self.count["modules"] += 1

    def _summary(self, t: torch.Tensor, h: torch.Tensor) -> tuple[dict, bytes]:
        """``stats.summary`` of ``t`` (``h``: its host view), reused while nothing wrote it."""
        key = storage_key(t)
        writes = self._obs.writes.get(key, 0) if self._obs is not None else 0
        last = self._last.get(id(t))
        if last is not None and last[0]() is t and last[1:3] == (key, writes):
            return last[3]
        got = stats.summary(h)
        try:
            self._last[id(t)] = (weakref.ref(t, lambda _, i=id(t), d=self._last: d.pop(i, None)),
                                 key, writes, got)
        except TypeError:
            pass
        return got

    def _write(self, entry: dict, outs: list, name: str) -> None:
        hosts = [gold.host(t) if t.device.type == "rbln" else t.detach() for t in outs]
        rows, samples = [], []
        for t, h in zip(outs, hosts):
            summary, sample = self._summary(t, h)
            rows.append({"shape": list(t.shape), "dtype": region.dtype_name(t.dtype),
                         **summary, "sample": len(sample) // 4})
            samples.append(sample)
            self._devices.add(t.device.type)
            self._dtypes.add(region.dtype_name(t.dtype))
        if self.tensors:
            torch.save([h.cpu().clone() for h in hosts], self.path / "tensors" / name)
            entry["tensors"] = name
        with self._lock:
            for row, sample in zip(rows, samples):
                row["sample"] = [self._offset, row["sample"]]
                self._offset += row["sample"][1]
                self._samples.write(sample)
            entry["outputs"] = rows
            self._index.write(json.dumps(entry) + "\n")


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
