"""``safetensors`` on rbln: ``load_file(path, device="rbln")`` and ``safe_open(path, "pt",
device="rbln:1")`` put the tensors on that device.

safetensors parses the device in Rust against a fixed list of names (cpu, cuda, mps, npu, xpu,
xla, mlu, musa, hpu) and refuses the rest ("device rbln is invalid"), ``torch.device`` objects
included. It also takes a bare index, which it hands to ``tensor.to(index)``: torch reads that
as a device of the current accelerator, rbln. ``safe_open`` translates an rbln device into that
index; accelerate's ``load_checkpoint_and_dispatch`` (which passes ``"rbln:0"`` through
``load_file``/``safe_open``) works through it.
"""

from __future__ import annotations

from .patch import Integration, LibraryPatch, replace


def device_arg(device):
    """The ``device`` safetensors' parser accepts for a torch device: an rbln device (a name or
    a ``torch.device``) becomes its index, another ``torch.device`` its name; anything else is
    passed on unchanged (safetensors' own error names a bad one)."""
    import torch
    if isinstance(device, str) and not (device == "rbln" or device.startswith("rbln:")):
        return device
    if not isinstance(device, (str, torch.device)):
        return device
    dev = torch.device(device)
    if dev.type != "rbln":
        return str(dev)
    acc = torch.accelerator.current_accelerator()
    if acc is None or acc.type != "rbln":        # an index would name another accelerator
        raise RuntimeError(f"safetensors cannot load onto {dev}: rbln is not torch's current "
                           f"accelerator ({acc}); load onto the CPU and move the tensors")
    return dev.index if dev.index is not None else torch.rbln.current_device()


def _safe_open(module) -> None:
    """``safetensors.safe_open`` (which ``safetensors.torch.load_file`` and transformers' and
    accelerate's loaders call) takes rbln devices. A function that returns safetensors' own
    reader, so ``with safe_open(...) as f`` and every method of ``f`` are unchanged."""
    orig = module.safe_open

    def safe_open(filename, framework, device="cpu", **kwargs):
        return orig(filename, framework, device=device_arg(device), **kwargs)

    # also safetensors.torch's, if it was imported before torch loaded this package
    replace(module, safe_open)


INTEGRATION = Integration(
    library="safetensors",
    checked=("0.8.0",),
    patches=(
        LibraryPatch(
            "safetensors", ("safe_open",),
            "load_file and safe_open onto rbln, rbln:N, torch.device",
            "safetensors' device parser accepts any torch device (a torch.device, or a name "
            "torch.device() parses) and moves tensors with tensor.to(device)",
            _safe_open),
    ),
)
