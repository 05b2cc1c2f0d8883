"""Random generators on rbln (docs/torch-rbln.md ("Random numbers")), run in a fresh process with two devices."""

from __future__ import annotations

import pytest

from conftest import run_json


@pytest.fixture(scope="module")
def out():
    return run_json("""
    import torch.nn.functional as F
    res = {}

    def draw(gen, device):
        return torch.randn(64, generator=gen, device=device).cpu().tolist()

    g0, g1 = torch.Generator(device="rbln"), torch.Generator(device="rbln:1")
    res["devices"] = [str(g0.device), str(g1.device)]
    g0.manual_seed(1234); g1.manual_seed(1234)
    a0, a1 = draw(g0, "rbln:0"), draw(g1, "rbln:1")
    res["same_seed_same_numbers"] = a0 == a1
    res["equals_cpu_generator"] = a0 == torch.randn(64, generator=torch.Generator().manual_seed(1234)).tolist()
    res["seed_changes_numbers"] = draw(g0.manual_seed(99), "rbln") != a0

    # get_state / set_state round trip, on a generator and on the default generators
    st = g1.get_state()
    x = draw(g1, "rbln:1")
    g1.set_state(st)
    res["state_round_trip"] = [x == draw(g1, "rbln:1"), st.dtype == torch.uint8]
    c = g0.clone_state()
    res["clone_state"] = draw(c, "rbln") == draw(g0, "rbln")
    s1 = torch.rbln.get_rng_state(1)
    y = torch.rand(16, device="rbln:1").cpu().tolist()
    torch.rbln.set_rng_state(s1, 1)
    res["default_state_round_trip"] = y == torch.rand(16, device="rbln:1").cpu().tolist()
    states = torch.rbln.get_rng_state_all()
    res["state_all"] = len(states)

    # torch.manual_seed seeds every rbln device; the CPU generator does not advance rbln's
    torch.manual_seed(7)
    r0, r1 = torch.randn(8, device="rbln:0").cpu().tolist(), torch.randn(8, device="rbln:1").cpu().tolist()
    torch.manual_seed(7)
    torch.randn(100)
    res["manual_seed"] = [r0 == torch.randn(8, device="rbln:0").cpu().tolist(),
                          r1 == torch.randn(8, device="rbln:1").cpu().tolist(), r0 == r1]
    torch.rbln.manual_seed(5)            # only the current device
    q0 = torch.randn(8, device="rbln:0").cpu().tolist()
    torch.rbln.manual_seed(5)
    res["rbln_manual_seed"] = [q0 == torch.randn(8, device="rbln:0").cpu().tolist(),
                               torch.rbln.initial_seed(), torch.rbln.default_generator(1).initial_seed()]

    # dropout: reproducible under the device generator, different for another seed
    x = torch.ones(256, 64, dtype=torch.float16, device="rbln")
    def dropped(seed):
        torch.rbln.manual_seed(seed)
        return F.dropout(x, 0.5, training=True).cpu()
    d1, d2, d3 = dropped(3), dropped(3), dropped(4)
    res["dropout"] = [torch.equal(d1, d2), not torch.equal(d1, d3),
                      0.4 < (d1 == 0).float().mean().item() < 0.6, sorted(set(d1.flatten().tolist()))]
    layer = torch.nn.Dropout(0.25).train()
    torch.manual_seed(11); m1 = layer(x).cpu()
    torch.manual_seed(11); m2 = layer(x).cpu()
    res["dropout_module"] = torch.equal(m1, m2)

    # other random ops with an explicit rbln generator (CPU fallback draws from it)
    def ops(seed):
        g = torch.Generator(device="rbln").manual_seed(seed)
        p = torch.full((4, 8), 0.5, device="rbln")
        return [torch.randperm(20, generator=g, device="rbln").cpu().tolist(),
                torch.bernoulli(p, generator=g).cpu().tolist(),
                torch.multinomial(torch.ones(10, device="rbln"), 5, generator=g).cpu().tolist(),
                torch.empty(6, device="rbln").uniform_(generator=g).cpu().tolist(),
                torch.randint(0, 100, (6,), generator=g, device="rbln").cpu().tolist()]
    res["ops_repeat"] = ops(21) == ops(21) and ops(21) != ops(22)
    # a generator taken positionally (poisson) defaults to the device's generator as well
    rate = torch.full((32,), 3.0)
    torch.rbln.manual_seed(8)
    res["poisson"] = (torch.poisson(rate.to("rbln")).cpu().tolist()
                      == torch.poisson(rate, torch.Generator().manual_seed(8)).tolist())

    errors = []
    for f in (lambda: torch.Generator(device="rbln:2"), lambda: torch.rbln.get_rng_state(3),
              lambda: g0.get_offset()):
        try:
            f(); errors.append(None)
        except (RuntimeError, ValueError) as e:
            errors.append(str(e))
    res["errors"] = errors
    print(json.dumps(res))
    """, {"TORCH_RBLN_VIRTUAL_NPUS": "2"})


def test_generators_per_device(out):
    assert out["devices"] == ["rbln:0", "rbln:1"]


def test_same_seed_same_numbers_on_every_device(out):
    assert out["same_seed_same_numbers"]
    assert out["seed_changes_numbers"]


def test_an_rbln_generator_draws_what_a_cpu_generator_with_its_state_draws(out):
    assert out["equals_cpu_generator"]


def test_state_round_trips(out):
    assert out["state_round_trip"] == [True, True]
    assert out["clone_state"]
    assert out["default_state_round_trip"]
    assert out["state_all"] == 2


def test_torch_manual_seed_seeds_rbln(out):
    assert out["manual_seed"] == [True, True, True]
    same, seed0, seed1 = out["rbln_manual_seed"]
    assert same and seed0 == 5 and seed1 == 7


def test_dropout_is_reproducible_under_the_generator(out):
    same, differs, rate_ok, values = out["dropout"]
    assert same and differs and rate_ok and values == [0.0, 2.0]
    assert out["dropout_module"]


def test_random_ops_take_an_rbln_generator(out):
    assert out["ops_repeat"]
    assert out["poisson"]


def test_generator_errors(out):
    bad_gen, bad_state, offset = out["errors"]
    assert "rbln device index 2 is out of range [0, 2)" in bad_gen
    assert "rbln device index 3 is out of range [0, 2)" in bad_state
    assert "no offset" in offset
