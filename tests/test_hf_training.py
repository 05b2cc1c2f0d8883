"""The Hugging Face training stack on rbln with no set-up, against the CPU (torch_rbln/integrations).

``Trainer`` picks rbln by default and trains bit for bit as on the CPU, ``use_cpu=True`` keeps
the CPU, ``bf16=True``/``fp16=True`` autocast on rbln, ``resume_from_checkpoint`` restores the
rbln generators, ``Accelerator(mixed_precision="bf16")`` trains in bf16, safetensors and
accelerate's ``load_checkpoint_and_dispatch`` load onto rbln devices. Tiny random-weight Llama
models built in code (no downloads); the Trainer runs in fresh processes, whose first import is
transformers (the libraries are patched as the user imports them, torch loading part-way).
"""

from __future__ import annotations

import json
import textwrap
import warnings

import pytest
import torch

from conftest import run_code

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")
pytest.importorskip("safetensors")

ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error", "TQDM_DISABLE": "1"}

# the first import is transformers': torch (and the backend) load part-way through it
PRELUDE = """
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments
import json, os, torch

class Tokens(torch.utils.data.Dataset):
    def __init__(self, n=20, length=8, vocab=64):
        self.x = torch.randint(0, vocab, (n, length), generator=torch.Generator().manual_seed(1))
    def __len__(self):
        return len(self.x)
    def __getitem__(self, i):
        return {"input_ids": self.x[i], "labels": self.x[i]}

def tiny_llama(**kw):
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                        num_hidden_layers=1, num_attention_heads=2,
                                        num_key_value_heads=2, max_position_embeddings=32, **kw))

def train(out, steps=5, resume=None, save_steps=None, **kw):
    model = tiny_llama(attention_dropout=kw.pop("attention_dropout", 0.0))
    dtypes = set()
    model.model.layers[0].mlp.down_proj.register_forward_hook(
        lambda m, i, o: dtypes.add(str(o.dtype)))
    args = TrainingArguments(output_dir=out, per_device_train_batch_size=4, max_steps=steps,
                             learning_rate=1e-3, logging_steps=1, report_to=[], seed=0,
                             disable_tqdm=True,
                             save_strategy="steps" if save_steps else "no",
                             save_steps=save_steps or 500, **kw)
    trainer = Trainer(model=model, args=args, train_dataset=Tokens())
    trainer.train(resume_from_checkpoint=resume)
    return {"device": str(args.device), "n_gpu": args.n_gpu,
            "weights_on": sorted({str(p.device) for p in model.parameters()}),
            "losses": [h["loss"] for h in trainer.state.log_history if "loss" in h],
            "weights": {k: v.detach().cpu().double().flatten().tolist()
                        for k, v in model.state_dict().items()},
            "matmul_dtypes": sorted(dtypes)}
"""


def run(body: str, setup: str = "", timeout=600) -> dict:
    """``PRELUDE``, ``setup`` and ``body`` in a fresh process; its last stdout line is JSON."""
    r = run_code(PRELUDE + setup + textwrap.dedent(body), env=ENV, timeout=timeout)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def fp32_runs(tmp_path_factory):
    """The default Trainer (rbln) and ``use_cpu=True``, 5 steps each, one process."""
    out = tmp_path_factory.mktemp("trainer")
    return run(f"""
        args = TrainingArguments(output_dir={str(out)!r}, report_to=[])
        default = {{"device": str(args.device), "n_gpu": args.n_gpu,
                    "bf16_accepted": str(TrainingArguments(output_dir={str(out)!r}, report_to=[],
                                                           bf16=True).device)}}
        rbln = train({str(out)!r})
        cpu = train({str(out)!r}, use_cpu=True)
        from torch_rbln.integrations.patch import applied
        print(json.dumps({{"default": default, "rbln": rbln, "cpu": cpu, "applied": applied()}}))
    """)


def test_every_patch_applies_in_a_training_run(fp32_runs):
    from torch_rbln.integrations import LIBRARIES, integration
    expect = {lib: sorted(f"{p.module}.{t}" for p in integration(lib).patches for t in p.targets)
              for lib in LIBRARIES}
    assert {lib: sorted(t) for lib, t in fp32_runs["applied"].items()} == expect


def test_trainer_defaults_to_rbln_and_equals_the_cpu(fp32_runs):
    assert fp32_runs["default"] == {"device": "rbln:0", "n_gpu": 1, "bf16_accepted": "rbln:0"}
    rbln, cpu = fp32_runs["rbln"], fp32_runs["cpu"]
    assert (rbln["device"], rbln["n_gpu"], rbln["weights_on"]) == ("rbln:0", 1, ["rbln:0"])
    assert len(rbln["losses"]) == 5
    assert rbln["losses"] == cpu["losses"]              # bit for bit, fp32
    assert rbln["weights"] == cpu["weights"]
    assert rbln["matmul_dtypes"] == ["torch.float32"]


def test_use_cpu_still_trains_on_the_cpu(fp32_runs):
    cpu = fp32_runs["cpu"]
    assert (cpu["device"], cpu["n_gpu"], cpu["weights_on"]) == ("cpu", 0, ["cpu"])
    assert len(cpu["losses"]) == 5


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_trainer_mixed_precision_autocasts_on_rbln(precision, tmp_path):
    """``bf16=True``/``fp16=True``: the matmuls run in the half type on rbln, and the losses and
    weights are the CPU's (``use_cpu=True`` with the same flag) within its tolerance.
    accelerate autocasts the CPU in bf16 only: with ``fp16=True`` the CPU trains in fp32."""
    dtype = getattr(torch, {"bf16": "bfloat16", "fp16": "float16"}[precision])
    res = run(f"""
        rbln = train({str(tmp_path)!r}, {precision}=True)
        cpu = train({str(tmp_path)!r}, {precision}=True, use_cpu=True)
        print(json.dumps({{"rbln": rbln, "cpu": cpu}}))
    """)
    rbln, cpu = res["rbln"], res["cpu"]
    assert rbln["weights_on"] == ["rbln:0"] and cpu["weights_on"] == ["cpu"]
    assert rbln["matmul_dtypes"] == [str(dtype)]
    assert cpu["matmul_dtypes"] == [str(dtype) if precision == "bf16" else "torch.float32"]
    torch.testing.assert_close(torch.tensor(rbln["losses"]), torch.tensor(cpu["losses"]),
                               rtol=1e-3, atol=0)
    # AdamW moves each weight by about lr a step whatever the gradient's size, so where a
    # gradient is near 0 the half type can flip a step: 2 * lr * steps apart at most
    for k, w in rbln["weights"].items():
        torch.testing.assert_close(torch.tensor(w), torch.tensor(cpu["weights"][k]),
                                   rtol=0, atol=2 * 1e-3 * 5)


def test_resume_with_dropout_restores_the_rbln_generators(tmp_path):
    """Stopped after 2 of 4 steps and resumed, a run with attention dropout ends with the
    uninterrupted run's weights, bit for bit; the checkpoint holds the rbln generators."""
    res = run(f"""
        out = {str(tmp_path)!r}
        whole = train(out, steps=4, save_steps=2, attention_dropout=0.5)
        resumed = train(out, steps=4, resume=os.path.join(out, "checkpoint-2"),
                        attention_dropout=0.5)
        states = torch.load(os.path.join(out, "checkpoint-2", "rng_state.pth"),
                            weights_only=False)
        print(json.dumps({{"whole": whole, "resumed": resumed, "keys": sorted(states)}}))
    """)
    assert res["keys"] == ["cpu", "numpy", "python", "rbln"]
    assert res["whole"]["weights_on"] == ["rbln:0"]
    assert res["resumed"]["weights"] == res["whole"]["weights"]
    # the first two come from the checkpoint's log, the last two from the resumed steps
    assert res["resumed"]["losses"] == res["whole"]["losses"]


ACCELERATOR = """
from accelerate import Accelerator
from accelerate.state import AcceleratorState
from accelerate.utils import get_torch_accelerator_backend

def accelerate_train(mixed_precision, cpu):
    AcceleratorState._reset_state(True)
    acc = Accelerator(mixed_precision=mixed_precision, cpu=cpu)
    model = tiny_llama()
    dtypes = set()       # the outputs accelerate returns are fp32: look inside
    model.model.layers[0].mlp.down_proj.register_forward_hook(
        lambda m, i, o: dtypes.add(str(o.dtype)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model, opt = acc.prepare(model, opt)
    batch = Tokens().x[:4].to(acc.device)
    losses = []
    for _ in range(3):
        out = model(input_ids=batch, labels=batch)      # prepare() autocasts the forward
        acc.backward(out.loss)
        opt.step()
        opt.zero_grad()
        losses.append(out.loss.item())
    return {"device": str(acc.device), "losses": losses, "dtypes": sorted(dtypes)}
"""


def test_accelerate_asks_torch_rbln():
    """accelerate's device module for rbln is torch.rbln: its fp16 check asks rbln's autocast
    (fp16 trains in fp16; refused with accelerate's error where rbln's autocast lacks it)."""
    res = run(setup=ACCELERATOR, body="""
        device_type, module = get_torch_accelerator_backend()
        fp16 = accelerate_train("fp16", cpu=False)["dtypes"]
        torch.rbln.get_amp_supported_dtype = lambda: [torch.bfloat16]   # as if fp16 were not
        try:
            accelerate_train("fp16", cpu=False)
            refused = None
        except ValueError as e:
            refused = str(e)
        print(json.dumps({"backend": [device_type, module.__name__], "fp16": fp16,
                          "refused": refused}))
    """)
    assert res["backend"] == ["rbln", "torch_rbln.api"]
    assert res["fp16"] == ["torch.float16"]
    assert res["refused"] == "fp16 mixed precision is not supported on 'rbln'."


def test_accelerator_bf16_trains_in_bf16_autocast():
    res = run(setup=ACCELERATOR, body="""
        print(json.dumps({"rbln": accelerate_train("bf16", cpu=False),
                          "cpu": accelerate_train("bf16", cpu=True)}))
    """)
    rbln, cpu = res["rbln"], res["cpu"]
    assert rbln["device"].startswith("rbln") and cpu["device"] == "cpu"
    assert rbln["dtypes"] == cpu["dtypes"] == ["torch.bfloat16"]
    torch.testing.assert_close(torch.tensor(rbln["losses"]), torch.tensor(cpu["losses"]),
                               rtol=1e-3, atol=0)


def test_safetensors_loads_onto_rbln_devices(tmp_path):
    """``load_file`` and ``safe_open`` with ``"rbln"``, ``"rbln:1"`` and ``torch.device``: the
    tensors land on that device with the saved values (two logical devices)."""
    path = tmp_path / "t.safetensors"
    r = run_code(f"""
import json, torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
saved = {{"w": torch.randn(4, 3), "i": torch.arange(5), "h": torch.randn(2, 2).bfloat16()}}
save_file({{k: v.to("rbln:1") for k, v in saved.items()}}, {str(path)!r})   # from rbln, too
out = {{}}
for dev in ("rbln", "rbln:0", "rbln:1", torch.device("rbln", 1), torch.device("rbln")):
    got = load_file({str(path)!r}, device=dev)
    out[repr(dev)] = sorted([k, str(v.device), v.dtype == saved[k].dtype
                             and torch.equal(v.cpu(), saved[k])] for k, v in got.items())
with safe_open({str(path)!r}, "pt", device="rbln:1") as f:
    w, part = f.get_tensor("w"), f.get_slice("w")[1:3]
    out["safe_open"] = [str(w.device), torch.equal(w.cpu(), saved["w"]),
                        str(part.device), torch.equal(part.cpu(), saved["w"][1:3])]
torch.rbln.set_device(1)
out["current"] = str(load_file({str(path)!r}, device="rbln")["w"].device)
print(json.dumps(out))
""", env={"TORCH_RBLN_VIRTUAL_NPUS": "2"})
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    expect = {"'rbln'": 0, "'rbln:0'": 0, "'rbln:1'": 1, "device(type='rbln', index=1)": 1,
              "device(type='rbln')": 0}
    for dev, index in expect.items():
        assert out[dev] == [[k, f"rbln:{index}", True] for k in ("h", "i", "w")], dev
    assert out["safe_open"] == ["rbln:1", True, "rbln:1", True]
    assert out["current"] == "rbln:1"


@pytest.mark.parametrize("device_map", [{"": "rbln"}, {"": 0}], ids=["rbln", "index"])
def test_load_checkpoint_and_dispatch_onto_rbln(device_map, tmp_path):
    from accelerate import init_empty_weights, load_checkpoint_and_dispatch
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                      num_hidden_layers=1, num_attention_heads=2,
                                      num_key_value_heads=2, max_position_embeddings=32)
    ref = transformers.LlamaForCausalLM(config).eval()
    ref.save_pretrained(tmp_path)
    with init_empty_weights():
        empty = transformers.LlamaForCausalLM(config)
    model = load_checkpoint_and_dispatch(empty, str(tmp_path), device_map=device_map).eval()
    assert {str(t.device) for t in model.state_dict().values()} == {"rbln:0"}
    for k, v in ref.state_dict().items():
        assert torch.equal(model.state_dict()[k].cpu(), v), k
    ids = torch.randint(0, 64, (1, 8))
    with torch.no_grad():
        torch.testing.assert_close(model(ids.to("rbln")).logits.cpu(), ref(ids).logits,
                                   rtol=0, atol=0)


def test_import_torch_imports_no_library():
    """The libraries wait for the user's import: ``import torch`` loads none of them, nor their
    integration modules."""
    r = run_code("import sys, torch\n"
                 "print(sorted(m for m in sys.modules if m.split('.')[0] in "
                 "('transformers', 'accelerate', 'safetensors') "
                 "or m.startswith('torch_rbln.integrations')))")
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == ["['torch_rbln.integrations',", "'torch_rbln.integrations.post_import']"]


def test_an_unchecked_library_version_warns_and_still_patches(tmp_path):
    r = run_code(f"""
import warnings
warnings.simplefilter("always")
import safetensors
safetensors.__version__ = "0.0.1"          # as if another release were installed
with warnings.catch_warnings(record=True) as caught:
    import torch
    from safetensors.torch import load_file, save_file
save_file({{"w": torch.ones(2)}}, {str(tmp_path / 'w.safetensors')!r})
print(load_file({str(tmp_path / 'w.safetensors')!r}, device="rbln")["w"].device)
for w in caught:
    print(w.category.__name__, w.message)
""")
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.splitlines()
    assert lines[0] == "rbln:0"
    assert ("IntegrationWarning torch-rbln's safetensors integration was checked against "
            "safetensors 0.8.0; safetensors 0.0.1 is installed. Its patches are applied") in "\n".join(lines)


def test_a_patch_that_no_longer_fits_warns():
    """A target missing in the library (renamed upstream): a warning naming it, no error."""
    import types

    from torch_rbln.integrations import integration
    from torch_rbln.integrations.patch import Integration, IntegrationWarning, apply
    real = integration("transformers")
    patch = real.patches[0]
    fake = Integration("transformers-renamed", real.checked, (patch,))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        apply(fake, patch, types.ModuleType(patch.module))    # no TrainingArguments in it
    messages = [str(w.message) for w in caught if w.category is IntegrationWarning]
    assert len(messages) == 2, messages           # the unknown version, the missing target
    assert messages[1].startswith(
        "torch-rbln could not patch transformers.training_args.TrainingArguments._setup_devices"
        " of transformers-renamed None (AttributeError: ")
    assert messages[1].endswith(f"so on rbln this may not hold: {patch.why}")
