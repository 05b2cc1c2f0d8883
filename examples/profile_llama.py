"""torch.profiler on rbln: where the time of a small Llama forward goes (docs/profiling.md ("Profiling")).

    python examples/profile_llama.py [trace.json]

Prints the ops ranked by the NPU's time and writes a chrome trace (open it in
https://ui.perfetto.dev or chrome://tracing).
"""

import sys

import torch
from torch.profiler import ProfilerActivity, profile
from transformers import LlamaConfig, LlamaForCausalLM

torch.manual_seed(0)
cfg = LlamaConfig(vocab_size=1024, hidden_size=256, intermediate_size=704, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
model = LlamaForCausalLM(cfg).to(torch.float16).eval().to("rbln")
ids = torch.randint(0, cfg.vocab_size, (1, 64)).to("rbln")

with torch.inference_mode():
    model(ids)                       # warm up: the first call compiles every op
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1],
                 profile_memory=True) as prof:
        logits = model(ids).logits.cpu()

print(prof.key_averages().table(sort_by="self_device_time_total", row_limit=10))
prof.export_chrome_trace(sys.argv[1] if len(sys.argv) > 1 else "trace.json")
