"""Fused one-token decoding kernels (triton_ops.recurrent_step_decay_additive / _delta_rule).

Ground truth is mixers._step, the PyTorch step mixers.py decodes with, run in fp64. The fp32
claims, at value widths that are not powers of two (mLSTM decodes with Dv = head_dim + 1), run
on the GPU when there is one, compiled, and otherwise on the CPU in Triton's interpreter; on a
GPU the same claim is also checked in bf16 at decoding sizes.
"""

import os

import pytest
import torch
import torch.nn.functional as F

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

pytest.importorskip("triton")
import triton_ops  # noqa: E402
import mixers  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"  # where every claim runs
CUDA = DEV == "cuda" and os.environ.get("TRITON_INTERPRET") != "1"  # compiled kernels
GATES = ["none", "head_const", "head", "channel"]
FAMILIES = ["additive", "delta"]


def make_inputs(family, gate, B, T, H, K, V, device=DEV, dtype=torch.float32, seed=0):
    """q, k, v [B, T, H, *] as the layers make them (views of one fused projection, so not
    contiguous), beta [B, T, H] or None, a log decay g <= 0 of the asked granularity, h0."""
    gen = torch.Generator(device).manual_seed(seed)
    rnd = lambda *s: torch.randn(*s, generator=gen, device=device)  # noqa: E731
    qkv = rnd(B, T, 2 * H * K + H * V)
    q, k, v = qkv.split([H * K, H * K, H * V], -1)
    q, k, v = q.view(B, T, H, K), k.view(B, T, H, K), v.view(B, T, H, V)
    beta = None
    if family == "delta":
        k = F.normalize(k, dim=-1)  # unit keys, as DeltaNet's layers make them
        beta = torch.sigmoid(rnd(B, T, H)).to(dtype)
    shape = {"none": None, "head_const": (H,), "head": (B, T, H), "channel": (B, T, H, K)}[gate]
    g = None if shape is None else F.logsigmoid(rnd(*shape) + 2.0)  # fp32, as the layers pass it
    h0 = rnd(B, H, K, V)
    return q.to(dtype), k.to(dtype), v.to(dtype), beta, g, h0


def kernel_step(q, k, v, beta, g, h0, scale):
    if beta is None:
        return triton_ops.recurrent_step_decay_additive(q, k, v, g, h0, scale)
    return triton_ops.recurrent_step_delta_rule(q, k, v, beta, g, h0, scale)


def reference_step(q, k, v, beta, g, h0, scale):
    """mixers._step in fp64 (it keeps float64 as float64), output cast to v's dtype."""
    f64 = lambda x: None if x is None else x.double()  # noqa: E731
    o, S = mixers._step(f64(q), f64(k), f64(v), f64(beta), f64(g), f64(h0), scale)
    return o.to(v.dtype), S


def rel(out, ref):
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


@pytest.mark.parametrize("with_state", [True, False])
@pytest.mark.parametrize("K,V", [(16, 17), (32, 33)])
@pytest.mark.parametrize("gate", GATES)
@pytest.mark.parametrize("family", FAMILIES)
def test_step_equals_mixers_step(family, gate, K, V, with_state):
    """One token: output and new state equal mixers' PyTorch step; the old state is untouched."""
    q, k, v, beta, g, h0 = make_inputs(family, gate, B=2, T=1, H=3, K=K, V=V)
    h0 = h0 if with_state else None
    before = None if h0 is None else h0.clone()
    o, S = kernel_step(q, k, v, beta, g, h0, scale=0.3)  # 0.3, not Dk**-0.5: a lost scale shows
    ro, rS = reference_step(q, k, v, beta, g, h0, scale=0.3)
    assert o.shape == (2, 1, 3, V) and o.dtype == v.dtype
    assert S.shape == (2, 3, K, V) and S.dtype == torch.float32
    assert rel(o, ro) < 1e-5 and rel(S, rS) < 1e-5, (rel(o, ro), rel(S, rS))
    if h0 is not None:
        assert S.data_ptr() != h0.data_ptr() and torch.equal(h0, before)


@pytest.mark.parametrize("gate", GATES)
@pytest.mark.parametrize("family", FAMILIES)
def test_steps_equal_recurrence(family, gate):
    """A run of kernel steps, each from the last one's state, equals the token-by-token loop."""
    T = 6
    q, k, v, beta, g, h0 = make_inputs(family, gate, B=2, T=T, H=2, K=16, V=17, seed=1)
    S, outs = h0, []
    for t in range(T):
        sl = slice(t, t + 1)
        g_t = g if g is None or g.dim() == 1 else g[:, sl]
        o, S = kernel_step(q[:, sl], k[:, sl], v[:, sl], None if beta is None else beta[:, sl], g_t, S, 0.3)
        outs.append(o)
    f64 = lambda x: None if x is None else x.double()  # noqa: E731
    if beta is None:
        ro, rS = mixers.recurrent_decay_additive(f64(q), f64(k), f64(v), f64(g), f64(h0), 0.3)
    else:
        ro, rS = mixers.recurrent_delta_rule(f64(q), f64(k), f64(v), f64(beta), f64(g), f64(h0), 0.3)
    assert rel(torch.cat(outs, 1), ro) < 1e-5 and rel(S, rS) < 1e-5


def test_step_refuses_gradients():
    """No backward exists, so inputs that require gradients are an error, not a silent detach."""
    q, k, v, beta, g, h0 = make_inputs("delta", "head", B=1, T=1, H=2, K=16, V=17)
    with pytest.raises(AssertionError, match="no_grad"):
        triton_ops.recurrent_step_delta_rule(q.requires_grad_(), k, v, beta, g, h0)
    with torch.no_grad():  # the way model.generate calls it
        triton_ops.recurrent_step_delta_rule(q, k, v, beta, g, h0)


@pytest.mark.skipif(not CUDA, reason="needs a GPU and compiled Triton")
@pytest.mark.parametrize("K", [64, 128])
@pytest.mark.parametrize("gate", GATES)
@pytest.mark.parametrize("family", FAMILIES)
def test_step_bf16_on_gpu(family, gate, K):
    """Decoding sizes in bf16 (Dv = 65, mLSTM's value width): the kernel equals mixers._step."""
    q, k, v, beta, g, h0 = make_inputs(family, gate, B=4, T=1, H=16, K=K, V=65, device="cuda",
                                       dtype=torch.bfloat16)
    o, S = kernel_step(q, k, v, beta, g, h0, scale=None)
    ro, rS = mixers._step(q, k, v, beta, g, h0, None)  # fp32 inside, o in bf16
    assert o.dtype == torch.bfloat16 and S.dtype == torch.float32
    assert rel(o, ro) < 1e-2 and rel(S, rS) < 1e-4, (rel(o, ro), rel(S, rS))  # S: fp32 both sides
