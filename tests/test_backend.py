"""The backend as a user meets it: autoload, the tutorial's steps 1 and 2 as scripts, and the
torch.rbln device surface."""

from __future__ import annotations

import pytest
import torch

from conftest import EXAMPLES, run_code, run_script


def test_step1_add_script():
    r = run_script(EXAMPLES / "add.py", cwd=EXAMPLES)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == \
        "rbln:0 torch.float16 tensor([1., 2., 3., 4.], dtype=torch.float16)"


MODULE_VS_CPU = r"""
import runpy, torch
ns = runpy.run_path("module.py")
net, x, y = ns["net"], ns["x"], ns["y"]
cpu = net.cpu()
with torch.inference_mode():
    want = cpu(x.cpu())
print("EQUAL", torch.equal(y.cpu(), want))
"""


def test_step2_module_script_prints_and_equals_cpu():
    r = run_script(EXAMPLES / "module.py", cwd=EXAMPLES)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "torch.Size([4, 64]) torch.float16 rbln:0"
    r = run_code(MODULE_VS_CPU, cwd=EXAMPLES)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "EQUAL True"


def test_import_torch_alone_enables_rbln():
    r = run_code("import torch, sys; t = torch.ones(2, device='rbln'); "
                 "print(t.device, hasattr(torch, 'rbln'), 'torch_rbln' in sys.modules)")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "rbln:0 True True"


def test_autoload_can_be_disabled_and_enabled_explicitly():
    code = ("import sys, torch\n"
            "print('loaded', 'torch_rbln' in sys.modules)\n"
            "try:\n    torch.ones(1, device='rbln')\nexcept RuntimeError as e:\n    print('no rbln')\n"
            "import torch_rbln\n"
            "print(torch.ones(2, device='rbln').device, torch_rbln.status)\n")
    r = run_code(code, env={"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["loaded", "False", "no", "rbln", "rbln:0", "initialized"]


def test_device_api():
    assert torch.rbln.is_available() and torch.rbln.device_count() == 1
    torch.rbln.set_device(0)
    assert torch.rbln.current_device() == 0 and torch.rbln.is_initialized()
    assert torch.rbln.get_device_name() == "RBLN-CA25"
    props = torch.rbln.get_device_properties(0)
    assert props.name == "RBLN-CA25" and props.total_memory == 16 << 30 and props.npu_count == 1
    assert repr(props).startswith("DeviceProperties(name='RBLN-CA25', total_memory=17179869184")
    torch.rbln.set_device(0)
    torch.rbln.set_device(-1)                       # negative: no-op
    torch.rbln.synchronize()
    with torch.rbln.device(0):
        assert torch.rbln.current_device() == 0
    t = torch.ones(1, device="rbln")
    with torch.rbln.device_of(t):
        assert torch.rbln.current_device() == 0
    with torch.rbln.device_of(torch.ones(1)):       # not on rbln: no-op
        pass
    with pytest.raises(TypeError, match="Expected Tensor or Storage"):
        torch.rbln.device_of(3)
    with pytest.raises(ValueError, match=r"rbln device index 3 is out of range \[0, 1\)"):
        torch.rbln.set_device(3)
    with pytest.raises(ValueError, match="Expected rbln device, but got cpu"):
        torch.rbln.set_device("cpu")
    with pytest.raises(TypeError, match="Invalid device type"):
        torch.rbln.set_device(1.5)
    with pytest.raises(RuntimeError, match="out of range"):
        torch.ones(1, device="rbln:1")


def test_rng_surface():
    torch.rbln.manual_seed_all(7)
    a = torch.rbln.get_rng_state_all()
    torch.rbln.set_rng_state_all(a)
    assert torch.equal(torch.rbln.get_rng_state(), a[0])
    torch.manual_seed(3)                 # torch.manual_seed seeds rbln too
    x = torch.randn(4, device="rbln").cpu()
    torch.manual_seed(3)
    assert torch.equal(torch.randn(4, device="rbln").cpu(), x)


def test_torch_accelerator_sees_rbln():
    assert torch.accelerator.is_available()
    assert torch.accelerator.current_accelerator() == torch.device("rbln")
    assert torch.accelerator.device_count() == 1
    torch.accelerator.synchronize()
    t = torch.ones(1024, dtype=torch.float16, device="rbln") + 1   # a device op: device memory in use
    assert torch.accelerator.memory_allocated() == torch.rbln.memory_allocated() > 0
    assert torch.accelerator.memory_stats()["reserved_bytes.all.current"] == torch.rbln.memory_reserved()
    free, total = torch.accelerator.get_memory_info()
    assert total == torch.rbln.get_device_properties().total_memory
    torch.accelerator.reset_peak_memory_stats()
    assert torch.accelerator.max_memory_allocated() == torch.rbln.memory_allocated()
    del t


def test_bad_env_values_are_named():
    r = run_code("import torch; torch.zeros(2, device='rbln') + 1",
                 env={"TORCH_RBLN_LOG_LEVEL": "LOUD"})
    assert r.returncode != 0
    assert "TORCH_RBLN_LOG_LEVEL" in r.stderr and "DEBUG, INFO, WARNING, ERROR" in r.stderr
