"""Autocast on rbln as the reference does it (docs/torch-rbln.md ("Autocast")): not supported, so
``torch.autocast("rbln", ...)`` warns and disables itself; run in a fresh process."""

from __future__ import annotations

from conftest import run_json


def test_autocast_disables_itself_and_the_region_runs():
    out = run_json("""
    import warnings
    res = {"amp_dtypes": torch.rbln.get_amp_supported_dtype()}
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 64).half().to("rbln")
    x = torch.randn(4, 64, dtype=torch.float16, device="rbln")
    ref = lin(x).cpu()
    for name, kwargs in (("fp16", dict(dtype=torch.float16)), ("bf16", dict(dtype=torch.bfloat16)),
                         ("off", dict(dtype=torch.float16, enabled=False)), ("default", {})):
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            with torch.autocast(device_type="rbln", **kwargs):
                enabled = torch.is_autocast_enabled("rbln")
                y = lin(x)
        res[name] = [enabled, str(y.dtype), torch.equal(y.cpu(), ref), [str(m.message) for m in w]]
    torch.set_autocast_enabled("rbln", True)           # forced on: ops run as without it
    y = lin(x)
    torch.set_autocast_enabled("rbln", False)
    res["forced"] = [str(y.dtype), torch.equal(y.cpu(), ref)]
    print(json.dumps(res))
    """)
    assert out["amp_dtypes"] == []
    for name in ("fp16", "bf16", "default"):
        enabled, dtype, same, warned = out[name]
        assert not enabled and dtype == "torch.float16" and same, name
        assert len(warned) == 1 and "Disabling autocast" in warned[0], (name, warned)
    enabled, dtype, same, warned = out["off"]
    assert not enabled and dtype == "torch.float16" and same and warned == []
    assert out["forced"] == ["torch.float16", True]
