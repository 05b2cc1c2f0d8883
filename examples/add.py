import torch

device = "rbln"

a = torch.arange(64, dtype=torch.float16, device=device)
b = torch.ones(64, dtype=torch.float16, device=device)

c = a + b
print(c.device, c.dtype, c[:4].cpu())  # expect: rbln:0, fp16, [1., 2., 3., 4.]
