import torch

net = (
    torch.nn.Sequential(
        torch.nn.Linear(64, 128),
        torch.nn.SiLU(),
        torch.nn.Linear(128, 64),
    )
    .to(torch.float16)
    .to("rbln")
    .eval()
)

x = torch.ones(4, 64, dtype=torch.float16, device="rbln")

with torch.inference_mode():
    net(x)  # warmup: compiles the three ops

with torch.inference_mode(), torch.rbln.explain() as p:
    y = net(x)

print(p.report())

# a deliberate fallback: fp32 is outside the device dtype policy, and the dtype
# conversion that makes the operand is a copy through the host
with torch.rbln.explain(with_stack=True) as p:
    w = x.float() * 2.0

print(p.report())
print(p.verdict())

# new layer sizes: the compile cache is keyed by op and shape, so these programs are
# not cached yet even though a module of the same kind already ran
net_wide = (
    torch.nn.Sequential(
        torch.nn.Linear(64, 256),
        torch.nn.SiLU(),
        torch.nn.Linear(256, 64),
    )
    .to(torch.float16)
    .to("rbln")
    .eval()
)

with torch.inference_mode():
    cold, warm = torch.rbln.explain_steady(
        lambda: net_wide(x), warmup=2, return_cold=True
    )

print(cold.verdict()["reasons"])
print(warm.verdict()["clean"])
print(cold.diff(warm).report())
