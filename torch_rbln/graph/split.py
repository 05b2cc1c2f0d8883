"""Split an aten graph into device partitions and host partitions.

Device partitions are maximal groups of device nodes (plus the free nodes between them, and the
nodes the compiler keeps on its host side, "in-program") that can run as one program without a
cycle through the host; each becomes one launch. The nodes left over form host partitions,
run on the host (``backend.py`` says how), except operators with their own rbln kernel
("eager" placement), which stay in the outer graph between partitions. The outer graph then
only calls partitions and those operators, and unpacks their results.
"""

from __future__ import annotations

import operator

import torch
import torch.fx
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase
from torch.fx.passes.utils.fuser_utils import fuse_by_partitions

from .placement import Placement, place_graph


_IN_PROGRAM = ("device", "in-program")


class _Support(OperatorSupportBase):
    def __init__(self, pred):
        self.pred = pred

    def is_node_supported(self, submodules, node) -> bool:
        return node.op == "call_function" and self.pred(node)


def _is_tensor_node(node: torch.fx.Node) -> bool:
    return isinstance(node.meta.get("val"), torch.Tensor)


def _fuse(gm, pred, keep, prefix: str) -> list[str]:
    parts = CapabilityBasedPartitioner(gm, _Support(pred),
                                       allows_single_node_partition=True).propose_partitions()
    parts = [p for p in parts if keep(p.nodes)]
    if not parts:
        return []
    # sort by first node so partition numbers follow program order
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    parts.sort(key=lambda p: min(order[n] for n in p.nodes))
    fuse_by_partitions(gm, [dict.fromkeys(p.nodes) for p in parts], prefix=prefix,
                       always_return_tuple=True)
    return [f"{prefix}{i}" for i in range(len(parts))]


def split(gm: torch.fx.GraphModule) -> tuple[dict, list]:
    """Partition ``gm`` in place into ``device_<i>`` and ``host_<j>`` submodules. Returns the
    placement of each original node (by node *name*) and the device submodules' names."""
    placed = place_graph(gm)
    by_name = {n.name: p for n, p in placed.items()}

    def on_device(n):
        p = placed.get(n)
        if p is None:
            return False
        return p.where in _IN_PROGRAM or (p.where == "free" and _is_tensor_node(n))

    device = _fuse(gm, on_device, lambda nodes: any(placed[n].where in _IN_PROGRAM for n in nodes),
                   "device_")
    # whatever computes outside a device partition runs on the host; the getitems that unpack a
    # device partition's results stay in the outer graph

    def eager(n):
        # by name: fusing the device partitions rebuilt the graph's node objects
        p = by_name.get(n.name) if n.op == "call_function" else None
        return p is not None and p.where == "eager"

    def on_host(n):
        if eager(n):
            return False        # runs by itself in the outer graph, on the rbln tensors
        return not (n.target is operator.getitem and isinstance(n.args[0], torch.fx.Node)
                    and (n.args[0].op == "call_module" or eager(n.args[0])))

    _fuse(gm, on_host, lambda nodes: True, "host_")
    gm.graph.lint()
    gm.recompile()
    return by_name, device


def placements_of(sub: torch.fx.GraphModule, by_name: dict) -> list[Placement]:
    """The placements of a partition's nodes, in program order (fusing keeps node names)."""
    return [by_name[n.name] for n in sub.graph.nodes
            if n.op == "call_function" and n.name in by_name]
