"""Triton kernels of the delta-rule family (triton_ops.chunk_delta_rule).

S_t = (I - beta_t k_t k_t^T) Diag(exp(g_t)) S_{t-1} + beta_t k_t v_t^T, o_t = S_t^T (scale q_t),
with g none (DeltaNet) / [B,T,H] (Gated DeltaNet) / [B,T,H,Dk] (KDA). Ground truth is
mixers.recurrent_delta_rule run in fp64 (token by token). The small fp32 claims run on the GPU
when there is one, compiled, and otherwise on the CPU in Triton's interpreter; on a GPU the same
claims are also checked (test_kernels_delta_gpu.py, and test_kernels_kda_gpu.py for KDA) at
larger shapes, in fp32 (fla's gated backward is wrong on Hopper with some triton versions:
fla-org/flash-linear-attention issue #640) and in bf16 with fla's tolerances (the ratios of its
tests' assert_close, tests/ops/test_gated_delta.py).
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

pytest.importorskip("triton")
import triton_ops  # noqa: E402
import mixers  # noqa: E402
from gradients import bounded_gates, run_and_grad  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"  # where every claim runs


def make_inputs(gate, B, T, H, K, V, device=DEV, dtype=torch.float32, seed=0):
    gen = torch.Generator(device).manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=gen, device=device)  # noqa: E731
    # L2-normalized keys and sigmoid betas, as the mixers make them (the delta rule assumes both)
    q, k, v = rnd(B, T, H, K), torch.nn.functional.normalize(rnd(B, T, H, K), dim=-1), rnd(B, T, H, V)
    beta = torch.sigmoid(rnd(B, T, H))
    shape = {"none": None, "head": (B, T, H), "channel": (B, T, H, K), "bounded": (B, T, H, K)}[gate]
    g = None if shape is None else torch.nn.functional.logsigmoid(rnd(*shape) + 2.0)
    if gate == "bounded":  # KDA's range, [GATE_MIN, 0], a third of the gates at the floor itself
        g = bounded_gates(shape, mixers.GATE_MIN, device, seed + 3)
    h0 = rnd(B, H, K, V)
    return [x.to(dtype) for x in (q, k, v)], beta.to(dtype), g, h0


def rel(out, ref):
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


def reference(q, k, v, beta, g, h0, scale=None):
    """The token-by-token loop of mixers.py in fp64 (the loop keeps float64 inputs in float64)."""
    f64 = lambda x: None if x is None else x.double()  # noqa: E731
    return mixers.recurrent_delta_rule(f64(q), f64(k), f64(v), f64(beta), f64(g), f64(h0), scale)


def check_against_recurrence(gate, B, T, H, K, V, with_state, device, dtype, tol):
    (q, k, v), beta, g, h0 = make_inputs(gate, B, T, H, K, V, device, dtype)
    h0 = h0 if with_state else None
    gen = torch.Generator(device).manual_seed(1)
    do = torch.randn(B, T, H, V, generator=gen, device=device)
    dht = torch.randn(B, H, K, V, generator=gen, device=device) if with_state else None
    scale = 0.3  # not Dk**-0.5, so a missing or doubled scale shows
    bound = {"gate_min": mixers.GATE_MIN} if gate == "bounded" else {}
    o, ht, grads = run_and_grad(triton_ops.chunk_delta_rule, q, k, v, beta, g, h0, do=do, dht=dht, scale=scale, **bound)
    ro, rht, rgrads = run_and_grad(reference, q, k, v, beta, g, h0, do=do, dht=dht, scale=scale)
    assert o.dtype == v.dtype and ht.dtype == torch.float32 and ht.shape == (B, H, K, V)
    names = ["dq", "dk", "dv", "dbeta"] + (["dg"] if g is not None else []) + (["dh0"] if with_state else [])
    errs = {"o": rel(o, ro), "ht": rel(ht, rht)}
    errs.update({n: rel(a, b) for n, a, b in zip(names, grads, rgrads)})
    for name, err in errs.items():
        limit = tol.get(name, tol["grad"])
        assert err < limit, f"{gate}: {name} relative error {err:.2e} >= {limit} ({errs})"
    for x in [o, ht] + grads:
        assert torch.isfinite(x).all()


# fp32 is exact up to rounding (seen: ~1e-6): in the interpreter, and compiled too, where the
# kernels switch their products to exact fp32 for fp32 inputs
FP32_TOL = {"o": 1e-5, "ht": 1e-5, "grad": 1e-5}


@pytest.mark.parametrize("gate,T,with_state", [
    ("none", 100, True),     # two chunks, the second ragged
    ("head", 100, True),
    ("channel", 100, True),  # four 16-row sub-chunks per chunk, per-channel rescaling
    ("channel", 40, False),  # one ragged chunk, no state in or out
    ("bounded", 100, True),  # gates in [GATE_MIN, 0]: diagonal sub-blocks as products
    ("bounded", 40, False),
])
def test_matches_recurrence_fp32(gate, T, with_state):
    # Dk = 20 and Dv = 24 are not powers of two: every block is masked
    check_against_recurrence(gate, 1, T, 2, 20, 24, with_state, DEV, torch.float32, FP32_TOL)


def test_state_hands_over():
    # one call over 150 tokens = 70 tokens, then 1 token, then 79, each from the last state
    (q, k, v), beta, g, h0 = make_inputs("channel", 1, 150, 2, 16, 16)
    whole, hw = triton_ops.chunk_delta_rule(q, k, v, beta, g, h0)
    outs, h = [], h0
    for a, b in [(0, 70), (70, 71), (71, 150)]:
        o, h = triton_ops.chunk_delta_rule(q[:, a:b], k[:, a:b], v[:, a:b], beta[:, a:b], g[:, a:b], h)
        outs.append(o)
    assert rel(torch.cat(outs, 1), whole) < 1e-5 and rel(h, hw) < 1e-5


def test_default_scale_and_no_state():
    (q, k, v), beta, g, _ = make_inputs("head", 1, 30, 2, 16, 16)
    o, ht = triton_ops.chunk_delta_rule(q, k, v, beta, g)
    ro, rht = reference(q, k, v, beta, g, None)
    assert rel(o, ro) < 1e-5 and rel(ht, rht) < 1e-5


def test_extreme_gates_stay_finite_and_exact():
    # log decays from -1e4 to 0 in neighbouring channels: exp(-G) would overflow in fp32,
    # and the forward, the backward and the gate gradient must all stay finite and right
    (q, k, v), beta, _, h0 = make_inputs("channel", 1, 70, 1, 16, 16)
    gen = torch.Generator(DEV).manual_seed(1)
    g = -torch.rand(1, 70, 1, 16, generator=gen, device=DEV) ** 4 * torch.tensor([0.0, 1.0, 30.0, 1e4], device=DEV).repeat(4)
    do, dht = torch.randn(1, 70, 1, 16, device=DEV), torch.randn(1, 1, 16, 16, device=DEV)
    o, ht, grads = run_and_grad(triton_ops.chunk_delta_rule, q, k, v, beta, g, h0, do=do, dht=dht)
    ro, rht, rgrads = run_and_grad(reference, q, k, v, beta, g, h0, do=do, dht=dht)
    for x in [o, ht] + grads:
        assert torch.isfinite(x).all()
    # in-chunk cumulative sums reach -1e5: their fp32 differences carry ~1e-4 relative error
    assert rel(o, ro) < 1e-3 and rel(ht, rht) < 1e-3
    for a, b in zip(grads, rgrads):
        assert rel(a, b) < 1e-3


def test_chunked_forms_match_the_recurrence_at_the_gate_floor():
    # every gate at GATE_MIN itself: 15 steps of -5 inside a sub-chunk, the widest span the
    # bounded kernels take (exp(75) in k's factor), for the PyTorch chunked form and the kernels
    (q, k, v), beta, g, h0 = make_inputs("channel", 1, 100, 2, 16, 16)
    g = torch.full_like(g, mixers.GATE_MIN)
    ro, rht = reference(q, k, v, beta, g, h0)
    for fn in (mixers.chunk_delta_rule, triton_ops.chunk_delta_rule):
        o, ht = fn(q, k, v, beta, g, h0, gate_min=mixers.GATE_MIN)
        assert rel(o, ro) < 1e-5 and rel(ht, rht) < 1e-5, fn.__module__


def test_later_gates_never_reach_earlier_outputs_or_gradients():
    # bounded kernels: change q, k, v, beta and the gates after t0 (inside a sub-chunk, mid-chunk)
    # and nothing at or before t0 may change, not even by rounding: the outputs, and the gradients
    # of a loss on them with respect to every input at or before t0. A diagonal block anchored at
    # a later row than its first (fla issue #1240) fails this
    (q, k, v), beta, g, h0 = make_inputs("bounded", 1, 100, 2, 16, 16)
    t0 = 16 + 6
    gen = torch.Generator(DEV).manual_seed(5)
    late = lambda x, lo=None: torch.cat([x[:, :t0 + 1], (torch.rand(x[:, t0 + 1:].shape, generator=gen, device=DEV)  # noqa: E731
                                         * (lo if lo is not None else 1.0))], 1)
    runs = []
    for inputs in [(q, k, v, beta, g), (late(q), late(k), late(v), late(beta), late(g, mixers.GATE_MIN))]:
        leaves = [x.detach().clone().requires_grad_() for x in inputs]
        o, _ = triton_ops.chunk_delta_rule(*leaves, h0, gate_min=mixers.GATE_MIN)
        o[:, :t0 + 1].square().sum().backward()
        runs.append([o[:, :t0 + 1]] + [x.grad[:, :t0 + 1] for x in leaves])
    for name, a, b in zip(["o", "dq", "dk", "dv", "dbeta", "dg"], *runs):
        assert torch.equal(a, b), f"{name} at or before t0 changed with later inputs"


def test_a_gate_bound_too_loose_for_the_products_is_named():
    (q, k, v), beta, g, _ = make_inputs("channel", 1, 20, 1, 16, 16)
    with pytest.raises(ValueError, match=r"gate_min=-10"):
        triton_ops.chunk_delta_rule(q, k, v, beta, g, gate_min=-10.0)
