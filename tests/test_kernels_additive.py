"""Triton kernels of the decayed-additive family (triton_ops.chunk_decay_additive).

S_t = exp(g_t) S_{t-1} + k_t v_t^T, o_t = S_t^T (scale q_t), with g none / [H] / [B,T,H] /
[B,T,H,Dk]. The small fp32 claims (tiny shapes, chunk 16 or 32 so that several chunks and
several 16-row sub-chunks are crossed) run on the GPU when there is one, compiled, and otherwise
on the CPU in Triton's interpreter; on a GPU the same claims are also checked in bf16 at larger
shapes, with fla's tolerances (test_kernels_additive_gpu.py). Ground truth is mixers.py's
token-by-token loop in fp64.
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
CUDA = DEV == "cuda" and os.environ.get("TRITON_INTERPRET") != "1"  # compiled kernels


def recurrence(q, k, v, g=None, h0=None, scale=None):
    """Ground truth: mixers.py's token-by-token loop, run in fp64."""
    f64 = lambda x: None if x is None else x.double()  # noqa: E731
    return mixers.recurrent_decay_additive(f64(q), f64(k), f64(v), f64(g), f64(h0), scale)


def make_inputs(gate, B, T, H, K, V, device=DEV, dtype=torch.float32, seed=0):
    gen = torch.Generator(device).manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=gen, device=device)  # noqa: E731
    q, k, v = rnd(B, T, H, K), rnd(B, T, H, K), rnd(B, T, H, V)
    shape = {"none": None, "head_const": (H,), "head": (B, T, H), "channel": (B, T, H, K)}[gate]
    # log decays <= 0 as the mixers make them: logsigmoid of a pre-activation
    g = None if shape is None else torch.nn.functional.logsigmoid(rnd(*shape) + 2.0)
    h0 = rnd(B, H, K, V)
    return [x.to(dtype) for x in (q, k, v)], g, h0


def rel(out, ref):
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


def check_against_recurrence(gate, B, T, H, K, V, chunk, with_state, device, dtype, tol, gate_min=None):
    """gate_min: per-channel gates drawn by bounded_gates, and the kernels told the bound."""
    (q, k, v), g, h0 = make_inputs(gate, B, T, H, K, V, device, dtype)
    g = g if gate_min is None else bounded_gates(g.shape, gate_min, device)
    h0 = h0 if with_state else None
    gen = torch.Generator(device).manual_seed(1)
    do = torch.randn(B, T, H, V, generator=gen, device=device)
    dht = torch.randn(B, H, K, V, generator=gen, device=device) if with_state else None
    scale = 0.3  # not Dk**-0.5, so a missing or doubled scale shows
    o, ht, grads = run_and_grad(triton_ops.chunk_decay_additive, q, k, v, g, h0, do=do, dht=dht,
                                scale=scale, chunk_size=chunk, gate_min=gate_min)
    # a constant decay's dg is one sum over every position of terms of both signs: the reference
    # runs with the gate repeated at each position, so that dg's error can be set against the
    # mass of those terms (against the sum itself it swings with their cancellation: 1.3e-3 to
    # 4.4e-2 for bf16 draws on an H200, where against the mass it stays under 1.3e-3)
    g_ref = g.expand(B, T, H) if gate == "head_const" else g
    ro, rht, rgrads = run_and_grad(recurrence, q, k, v, g_ref, h0, do=do, dht=dht, scale=scale)
    assert o.dtype == v.dtype and ht.dtype == torch.float32 and ht.shape == (B, H, K, V)
    names = ["dq", "dk", "dv"] + (["dg"] if g is not None else []) + (["dh0"] if with_state else [])
    errs = {"o": rel(o, ro), "ht": rel(ht, rht)}
    errs.update({n: rel(a, b) for n, a, b in zip(names, grads, rgrads)})
    if gate == "head_const":
        terms = rgrads[3]  # [B, T, H]
        errs["dg"] = ((grads[3].double() - terms.sum((0, 1))).abs() / terms.abs().sum((0, 1))).max().item()
    for name, err in errs.items():
        limit = tol.get(name, tol["grad"])
        assert err < limit, f"{gate}: {name} relative error {err:.2e} >= {limit} ({errs})"
    for x in [o, ht] + grads:
        assert torch.isfinite(x).all()


# fp32 in the interpreter is exact up to rounding. Compiled, tl.dot takes fp32 operands as tf32
# (10-bit mantissa), which these kernels keep (fp32 training is not their use)
FP32_TOL = {"o": 1e-5, "ht": 1e-5, "grad": 1e-5, "dg": 1e-5}
if CUDA:  # seen on an H200: 5e-4 to 1.8e-3
    FP32_TOL = {"o": 3e-3, "ht": 3e-3, "grad": 3e-3, "dg": 3e-3}


@pytest.mark.parametrize("gate,T,K,chunk,with_state", [
    ("none", 45, 20, 16, True),
    ("head_const", 45, 20, 32, True),
    ("head", 70, 20, 16, False),
    ("head", 20, 80, 16, True),      # two key blocks of 64
    ("channel", 70, 20, 32, True),   # two 16-row sub-chunks per chunk, a ragged last chunk
    ("channel", 37, 20, 16, False),  # one sub-chunk per chunk, no state in or out
    ("channel", 20, 80, 16, True),   # two key blocks of 64
])
def test_matches_recurrence_fp32(gate, T, K, chunk, with_state):
    # Dk = 20 or 80 and Dv = 17 are not powers of two: every block is masked
    check_against_recurrence(gate, 2, T, 2, K, 17, chunk, with_state, DEV, torch.float32, FP32_TOL)


@pytest.mark.parametrize("gate", ["head", "channel"])
def test_state_hands_over(gate):
    # one call over 45 tokens = 27 tokens, then 1 token, then 17, each from the last state
    (q, k, v), g, h0 = make_inputs(gate, 1, 45, 2, 16, 16)
    whole, hw = triton_ops.chunk_decay_additive(q, k, v, g, h0, chunk_size=16)
    outs, h = [], h0
    for a, b in [(0, 27), (27, 28), (28, 45)]:
        part = lambda x: None if x is None else x[:, a:b]  # noqa: E731
        o, h = triton_ops.chunk_decay_additive(part(q), part(k), part(v), part(g), h, chunk_size=16)
        outs.append(o)
    tol = FP32_TOL["o"]
    assert rel(torch.cat(outs, 1), whole) < tol and rel(h, hw) < tol


@pytest.mark.parametrize("gate", ["head_const", "head", "channel"])
def test_a_fixed_gate_leaves_the_other_gradients_bit_for_bit(gate):
    # a gate that is not learned (RetNet's decay) skips its gradient's work in the backward;
    # dq, dk, dv and dh0 stay those of the same call with the gate learned, and g gets none
    (q, k, v), g, h0 = make_inputs(gate, 1, 45, 1, 20, 17)
    do = torch.randn(1, 45, 1, 17, generator=torch.Generator(DEV).manual_seed(1), device=DEV)
    grads = {}
    for learned in (True, False):
        leaves = [x.clone().requires_grad_() for x in (q, k, v, h0)]
        gl = g.clone().requires_grad_(learned)
        o, _ = triton_ops.chunk_decay_additive(*leaves[:3], gl, leaves[3], chunk_size=32)
        o.backward(do)
        grads[learned] = [x.grad for x in leaves]
        assert (gl.grad is not None) == learned
    assert all(torch.equal(a, b) for a, b in zip(grads[True], grads[False]))


def test_extreme_gates_stay_finite_and_exact():
    # log decays from -1e4 to 0 in neighbouring channels: exp(-G) would overflow in fp32
    (q, k, v), _, h0 = make_inputs("channel", 1, 40, 1, 16, 16)
    gen = torch.Generator(DEV).manual_seed(1)
    g = -torch.rand(1, 40, 1, 16, generator=gen, device=DEV) ** 4 * torch.tensor([0.0, 1.0, 30.0, 1e4], device=DEV).repeat(4)
    o, ht = triton_ops.chunk_decay_additive(q, k, v, g, h0, chunk_size=32)
    ro, rht = recurrence(q, k, v, g, h0)
    assert torch.isfinite(o).all() and torch.isfinite(ht).all()
    # in-chunk cumulative sums reach -1e5: their fp32 differences carry ~1e-4 relative error
    # (compiled: tf32 products, 1.0e-3 seen on an H200)
    tol = 3e-3 if CUDA else 1e-3
    assert rel(o, ro) < tol and rel(ht, rht) < tol


@pytest.mark.parametrize("T,chunk,with_state", [
    (70, 32, True),   # two sub-chunks per chunk, a ragged last chunk
    (37, 16, False),  # one sub-chunk per chunk, no state in or out
])
def test_bounded_gates_match_recurrence_fp32(T, chunk, with_state):
    # gate_min = -5: a sub-chunk's decay spans up to 75 nats, and the diagonal sub-chunks are
    # one dot each (k rescaled by up to e^75) instead of the exact loop
    check_against_recurrence("channel", 2, T, 2, 20, 17, chunk, with_state, DEV, torch.float32, FP32_TOL,
                             gate_min=-5.0)


def test_bounded_gates_are_causal_bit_for_bit():
    # inputs changed only after t0 = 21 (row 5 of the second 16-row sub-chunk): outputs up to t0,
    # and the gradients of a loss on them with respect to inputs up to t0, do not move by one bit.
    # The new gates after t0 all sit at the bound, -5: an anchor inside the sub-chunk later than
    # t0 (its middle row, 24) would move by nats and change the rounding of rows <= t0
    B, T, H, K, V, t0 = 1, 48, 2, 20, 17, 21
    (q, k, v), g, h0 = make_inputs("channel", B, T, H, K, V)
    g = bounded_gates(g.shape, -5.0, DEV)
    do = torch.randn(B, T, H, V, device=DEV)
    do[:, t0 + 1:] = 0  # the loss sees the outputs up to t0 only
    (q2, k2, v2), _, _ = make_inputs("channel", B, T, H, K, V, seed=1)
    later = lambda x, y: torch.cat([x[:, :t0 + 1], y[:, t0 + 1:]], 1)  # noqa: E731
    changed = [later(q, q2), later(k, k2), later(v, v2), later(g, torch.full_like(g, -5.0)), h0]
    runs = [run_and_grad(triton_ops.chunk_decay_additive, *args, do=do, chunk_size=32, gate_min=gate_min)
            for args, gate_min in [([q, k, v, g, h0], -5.0), (changed, -5.0), ([q, k, v, g, h0], None)]]
    (o, _, grads), (o2, _, grads2), (o_exact, _, grads_exact) = runs
    assert not torch.equal(o, o2)  # the change is real
    for a, b in zip([o] + grads[:3], [o_exact] + grads_exact[:3]):  # o, dq, dk, dv: the bounded path ran
        assert not torch.equal(a, b)
    assert torch.equal(o[:, :t0 + 1], o2[:, :t0 + 1])
    for name, a, b in zip(["dq", "dk", "dv", "dg"], grads, grads2):
        assert torch.equal(a[:, :t0 + 1], b[:, :t0 + 1]), name
    assert torch.equal(grads[4], grads2[4]), "dh0"


def test_gate_min_out_of_range_is_named():
    (q, k, v), g, _ = make_inputs("channel", 1, 8, 2, 16, 16)
    with pytest.raises(ValueError, match=r"^gate_min=-10\.0: [^\n]*80[^\n]*$"):
        triton_ops.chunk_decay_additive(q, k, v, g, gate_min=-10.0)


def test_bad_gate_shape_is_named():
    (q, k, v), _, _ = make_inputs("none", 1, 8, 2, 16, 16)
    with pytest.raises(AssertionError, match=r"g \(1, 8\)"):
        triton_ops.chunk_decay_additive(q, k, v, torch.zeros(1, 8, device=DEV))
