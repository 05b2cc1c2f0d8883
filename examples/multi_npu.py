"""Collectives between NPUs with the rbln-ccl backend (the multi-NPU tutorial), one process per NPU.

    TORCH_RBLN_VIRTUAL_NPUS=2 RBLN_VISIBLE_DEVICES=0,1 torchrun --nproc-per-node=2 examples/multi_npu.py

torchrun gives every rank the same environment, so each rank keeps only its own NPU before its
first device use; init_process_group(backend="rbln-ccl") then connects the ranks, and
all_gather builds the table of every rank's tensor on every rank.
"""

import os

import torch
import torch.distributed as dist

local_rank = int(os.environ["LOCAL_RANK"])
os.environ["RBLN_VISIBLE_DEVICES"] = os.environ["RBLN_VISIBLE_DEVICES"].split(",")[local_rank]

dist.init_process_group(backend="rbln-ccl")
rank, world_size = dist.get_rank(), dist.get_world_size()

x = torch.full((4,), rank, dtype=torch.float16, device="rbln")
total = torch.full((4,), rank + 1, dtype=torch.float16, device="rbln")
table = [torch.empty_like(x) for _ in range(world_size)]
with torch.rbln.explain() as p:
    dist.all_gather(table, x)
    dist.all_reduce(total)

print(f"rank {rank}/{world_size} (NPU {os.environ['RBLN_VISIBLE_DEVICES']}): "
      f"all_gather {torch.stack(table).cpu().tolist()}, all_reduce of rank+1 {total.cpu().tolist()}")
if rank == 0:
    print(p.report())
dist.destroy_process_group()
