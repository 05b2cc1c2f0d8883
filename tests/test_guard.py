"""torch.rbln.guard: raises (or logs) at the op that does what its scope forbids, and only there."""

from __future__ import annotations

import logging
import threading

import pytest
import torch

H = torch.float16


def test_fallback_disallowed_raises_inside_the_scope_and_not_after_it():
    x = torch.arange(64, dtype=torch.float32).to("rbln")     # fp32: the dtype rule falls back
    with pytest.raises(torch.rbln.GuardError) as e:
        with torch.rbln.guard(fallback="disallow"):
            x * 3
    msg = str(e.value)
    assert msg.startswith("`aten::mul.out` ran on the CPU (dtype-not-fp16) at ")
    assert "test_guard.py:" in msg and 'guard(fallback="disallow")' in msg
    # after the scope the same op falls back quietly and computes the CPU's result
    torch.testing.assert_close((x * 3).cpu(), torch.arange(64, dtype=torch.float32) * 3)


def test_host_op_counts_as_a_fallback():
    x = torch.ones(64, dtype=H, device="rbln")
    with pytest.raises(torch.rbln.GuardError, match=r"`aten::sin.out` ran on the CPU \(no rbln kernel\)"):
        with torch.rbln.guard(fallback="disallow"):
            torch.sin(x)


def test_device_ops_pass_a_fallback_guard():
    x = torch.full((64,), 1.5, dtype=H, device="rbln")
    with torch.rbln.guard(fallback="disallow"):
        y = x * x
    torch.testing.assert_close(y.cpu(), torch.full((64,), 2.25, dtype=H))


def test_d2h_log_warns_with_the_user_line_and_returns_the_data(caplog):
    x = torch.full((64,), 3.0, dtype=H, device="rbln")
    y = x + x       # device-latest: reading it is a real device->host transfer
    logger = logging.getLogger("torch_rbln")
    logger.addHandler(caplog.handler)
    try:
        with torch.rbln.guard(d2h="log"):
            host = y.cpu()
    finally:
        logger.removeHandler(caplog.handler)
    torch.testing.assert_close(host, torch.full((64,), 6.0, dtype=H))
    msgs = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("torch.rbln.guard: data moved device->host (128 bytes) at ")
               and "test_guard.py:" in m for m in msgs), msgs


def test_d2h_disallowed_raises_and_the_tensor_stays_usable():
    x = torch.full((64,), 3.0, dtype=H, device="rbln")
    y = x + x
    with pytest.raises(torch.rbln.GuardError, match="moved device->host"):
        with torch.rbln.guard(d2h="disallow"):
            y.cpu()
    torch.testing.assert_close(y.cpu(), torch.full((64,), 6.0, dtype=H))


def test_inner_scope_overrides_and_allow_lifts():
    x = torch.arange(64, dtype=torch.float32).to("rbln")
    with torch.rbln.guard(fallback="disallow"):
        with torch.rbln.guard(fallback="allow"):
            y = x + 1
        with pytest.raises(torch.rbln.GuardError):
            x + 2
    torch.testing.assert_close(y.cpu(), torch.arange(64, dtype=torch.float32) + 1)


def test_a_guard_covers_only_its_own_thread():
    x = torch.arange(64, dtype=torch.float32).to("rbln")
    errors = []

    def other():
        try:
            (x * 5).cpu()
        except Exception as e:      # noqa: BLE001 - the test reports whatever it is
            errors.append(e)

    with torch.rbln.guard(fallback="disallow"):
        t = threading.Thread(target=other)
        t.start()
        t.join()
    assert errors == []


def test_bad_policy_is_refused():
    with pytest.raises(ValueError, match="expected one of"):
        with torch.rbln.guard(fallback="raise"):
            pass
