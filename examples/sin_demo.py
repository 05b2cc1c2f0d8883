import torch

x = torch.randn(64, dtype=torch.float16).to("rbln")

y = torch.sin(x)
print(y.device, y.shape)
