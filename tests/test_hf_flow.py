"""The Hugging Face causal-LM flow on rbln (examples/llama.py) against the CPU.

The grid is the one the vendor's model tests use: Llama-3.2-1B and Qwen2.5-1.5B architectures
with one decoder layer, fp16, eager and sdpa attention, batches of 1, 2 and 4 left-padded
prompts of 16, 128 and 1024 tokens, greedy 2-token ``generate``, in the default mode and with
``TORCH_RBLN_DEPLOY=ON``: the new tokens equal the CPU's. The checkpoints are built here
(``examples/make_llama.py``: real configurations, seeded random fp16 weights, a local
tokenizer) and loaded with ``from_pretrained`` as a user loads a downloaded one.

The default run covers every architecture and attention implementation with 16-token prompts
(batch 1, and batch 4 in both modes); the rest of the grid is slow (``--runslow``).
"""

from __future__ import annotations

import sys

import pytest
import torch

from conftest import EXAMPLES

transformers = pytest.importorskip("transformers")
sys.path.insert(0, str(EXAMPLES))
import llama  # noqa: E402
import make_llama  # noqa: E402

ARCHS = ("llama-3.2-1b", "qwen2.5-1.5b")
ATTNS = ("eager", "sdpa")
NEW_TOKENS = 2


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory):
    """arch -> a one-layer checkpoint directory, built on first use."""
    built = {}

    def get(arch):
        if arch not in built:
            built[arch] = make_llama.build(tmp_path_factory.mktemp(arch), arch, layers=1)
        return built[arch]
    return get


@pytest.fixture(scope="module")
def loaded(checkpoints):
    """(arch) -> (tokenizer, CPU model, rbln model); one architecture held at a time."""
    held = {}

    def get(arch):
        if arch not in held:
            held.clear()
            path = checkpoints(arch)
            tok = transformers.AutoTokenizer.from_pretrained(path, padding_side="left")
            tok.pad_token = tok.eos_token
            held[arch] = (tok, llama.load(path, "cpu", "sdpa"), llama.load(path, "rbln", "sdpa"))
        return held[arch]
    yield get
    held.clear()


_cpu_tokens: dict = {}


def _inputs(tok, batch, length):
    return tok((llama.PROMPTS * batch)[:batch], padding="max_length", max_length=length,
               return_tensors="pt")


def _grid():
    for arch in ARCHS:
        for attn in ATTNS:
            for length in (16, 128, 1024):
                for batch in (1, 2, 4):
                    for mode in ("default", "deploy"):
                        default = length == 16 and (batch, mode) in ((1, "default"), (4, "default"),
                                                                     (4, "deploy"))
                        marks = () if default else (pytest.mark.slow,)
                        yield pytest.param(arch, attn, length, batch, mode, marks=marks,
                                           id=f"{arch}-{attn}-L{length}-B{batch}-{mode}")


@pytest.mark.parametrize("arch,attn,length,batch,mode", list(_grid()))
def test_generate_matches_cpu(loaded, monkeypatch, arch, attn, length, batch, mode):
    tok, cpu, dev = loaded(arch)
    cpu.set_attn_implementation(attn)
    dev.set_attn_implementation(attn)
    enc = _inputs(tok, batch, length)
    assert (enc["attention_mask"] == 0).any(), "the prompts must be left-padded"
    key = (arch, attn, length, batch)
    if key not in _cpu_tokens:
        _cpu_tokens[key] = cpu.generate(**enc, max_new_tokens=NEW_TOKENS, do_sample=False)
    want = _cpu_tokens[key]
    if mode == "deploy":
        monkeypatch.setenv("TORCH_RBLN_DEPLOY", "ON")
    got = dev.generate(**enc.to("rbln"), max_new_tokens=NEW_TOKENS, do_sample=False)
    assert got.device.type == "rbln"
    assert got.shape == (batch, length + NEW_TOKENS)
    torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0,
                               msg=lambda m: f"{arch} {attn}: new tokens differ from the CPU's\n{m}")


def test_checkpoint_has_the_real_configuration(checkpoints):
    path = checkpoints("llama-3.2-1b")
    cfg = transformers.AutoConfig.from_pretrained(path)
    assert (cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim,
            cfg.intermediate_size, cfg.vocab_size) == (2048, 32, 8, 64, 8192, 128256)
    assert cfg.rope_parameters["rope_type"] == "llama3"
    assert cfg.rope_parameters["factor"] == 32.0 and cfg.tie_word_embeddings
    assert cfg.num_hidden_layers == 1
    model = transformers.AutoModelForCausalLM.from_pretrained(path)
    assert model.dtype == torch.float16             # saved in fp16, loaded as saved
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    w = model.model.layers[0].mlp.down_proj.weight.float()
    assert abs(w.std().item() - 0.02) < 1e-3         # the config's initializer_range
    assert model.model.norm.weight.eq(1).all()


TEXTS = ["Returns a new tensor with the sine of the elements of input.",
         "  two spaces, a\ttab and a\nnewline ",
         "unicode: ünïcödé ∑ 漢字 🙂",
         "def f(x):\n    return x ** 2  # code",
         ""]


def test_tokenizer_round_trips(checkpoints):
    tok = transformers.AutoTokenizer.from_pretrained(checkpoints("llama-3.2-1b"))
    assert tok.bos_token == make_llama.BOS and tok.eos_token == make_llama.EOS
    for text in TEXTS:
        ids = tok(text)["input_ids"]
        assert ids[0] == tok.bos_token_id                # Llama 3 style: BOS in front
        assert tok.decode(ids, skip_special_tokens=True) == text
    # trained, not a byte fallback: common words are single tokens
    assert len(tok("the tensor")["input_ids"]) == 3


def test_pipeline_on_rbln(checkpoints):
    path = checkpoints("llama-3.2-1b")
    prompt = llama.PROMPTS[0]
    kw = dict(max_new_tokens=3, do_sample=False, return_tensors=True)
    pipe = transformers.pipeline("text-generation", model=path, device="rbln")
    assert pipe.model.device == torch.device("rbln", 0) and pipe.model.dtype == torch.float16
    got = pipe(prompt, **kw)[0]["generated_token_ids"]
    del pipe
    want = transformers.pipeline("text-generation", model=path, device="cpu")(prompt, **kw)
    assert got == want[0]["generated_token_ids"]


def test_example_runs_and_agrees(checkpoints, capsys):
    """examples/llama.py as a user runs it (in this process: the compile cache is shared)."""
    llama.main(["--model", str(checkpoints("llama-3.2-1b")), "--batch", "2", "--length", "16",
                "--new-tokens", "3"])
    out = capsys.readouterr().out
    assert "new tokens on rbln and on the CPU agree: True" in out
    # the explain report of the first decode step: first-call compiles and the by-design
    # fallbacks (fp32 RMSNorm/RoPE, integer mask ops, rotate_half's 32-wide halves)
    report = out.split("first call:", 1)[1]
    assert "dispatch/recompile" in report and "aten::linear" in report
    assert "dtype-not-fp16" in report and "last-dim-not-64-aligned" in report
    steps = [ln for ln in out.splitlines() if ln.startswith("next decode step")]
    assert len(steps) == 2 and "TORCH_RBLN_DEPLOY=ON" in steps[1]
    d2h = [int(ln.split(", ")[-1].split()[0]) for ln in steps]
    assert d2h[1] < d2h[0]                                # deploy mode skips the NaN/Inf scan


@pytest.mark.slow
def test_graph_mode_decode_matches_eager(checkpoints):
    """The decode step under torch.compile(backend="rbln") gives eager's tokens."""
    path = checkpoints("llama-3.2-1b")
    tok = transformers.AutoTokenizer.from_pretrained(path, padding_side="left")
    tok.pad_token = tok.eos_token
    model = llama.load(path, "rbln", "sdpa")
    enc = _inputs(tok, 2, 32).to("rbln")
    compiled = torch.compile(model, backend="rbln")
    eager, _ = llama.greedy_static(model, model, enc, 4)
    with torch.rbln.capture_programs() as programs:
        graph, _ = llama.greedy_static(model, compiled, enc, 4)
    assert programs, "the decode step did not compile"
    assert torch.equal(graph.cpu(), eager.cpu())
    ref = model.generate(**enc, max_new_tokens=4, do_sample=False)[:, 32:]
    assert torch.equal(eager.cpu(), ref.cpu())        # the written-out loop is generate's
