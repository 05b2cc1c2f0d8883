import torch

device = "rbln"

a = torch.arange(64, dtype=torch.float32, device=device)
b = torch.ones(64, dtype=torch.float32, device=device)

with torch.rbln.explain(with_stack=True) as p:
    c = a + b

print(c.device, c.dtype, c[:4].cpu())
print(p.report())
