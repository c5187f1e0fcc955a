"""triton_ops.py's custom operators (namespace linearize): torch.compile, opcheck and distill_loss.

(a) torch.compile(fullgraph=True) over every public function: one graph (no break) holding the
    expected operator, opaque, and the same outputs and gradients as eager, bit for bit: the
    operators get the same inputs and run the same launches, and the code around them only
    reshapes, copies and casts. Also once with a dynamic length T (one graph for two lengths).
(b) torch.library.opcheck on the forward operators and the two families' backward operators:
    the schema (no input mutated or returned), the autograd registration, the fake
    implementation against the real one, and AOT dispatch with dynamic shapes.
(c) triton_ops.distill_loss against F.cross_entropy and log_softmax in float64: values, gradient
    (times an incoming gradient), rows that do not count, a temperature, no teacher.
(d) the backward of an operator with outputs nobody differentiates (the state and what the
    forward keeps for the backward; the loss's logged parts) fills no tensor of zeros for their
    gradients, and takes the final state's gradient alone.

On the CPU inductor compiles the graph around the operators to C++ and the kernels run in
Triton's interpreter; on a GPU all of it is compiled.
"""

import hashlib
import os

import pytest
import torch
import torch.nn.functional as F

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

pytest.importorskip("triton")
import triton_ops  # noqa: E402
from torch._dynamo.testing import CompileCounterWithBackend  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
B, T, H, K, V = 2, 20, 2, 16, 16  # T = 20: a ragged last chunk at chunk_size 16 (and 64)
ops = torch.ops.linearize


@pytest.fixture(scope="module")
def inductor():
    """torch.compile's default backend works here at all (a C++ compiler on the CPU)."""
    try:
        torch.compile(lambda x: x.sin() + 1, fullgraph=True)(torch.ones(4, device=DEV))
    except Exception as e:  # noqa: BLE001 - any failure of the toolchain itself
        if DEV == "cpu":
            pytest.skip(f"inductor cannot compile for the CPU on this machine: {type(e).__name__}: {e}"[:400])
        raise


def rnd(gen, *shape, grad=True, scale=1.0):
    x = scale * torch.randn(*shape, generator=gen, device=DEV)
    return x.requires_grad_(grad)


def logdecay(gen, *shape, grad=True):
    return F.logsigmoid(torch.randn(*shape, generator=gen, device=DEV) + 2.0).requires_grad_(grad)


def gate_of(gen, gate, grad=True):
    shape = {"none": None, "const": (H,), "head": (B, T, H), "channel": (B, T, H, K)}[gate]
    return None if shape is None else logdecay(gen, *shape, grad=grad)


def additive(gate, gate_min=None):
    def make(gen):
        return [rnd(gen, B, T, H, K), rnd(gen, B, T, H, K), rnd(gen, B, T, H, V), gate_of(gen, gate),
                rnd(gen, B, H, K, V)]
    return lambda q, k, v, g, h0: triton_ops.chunk_decay_additive(q, k, v, g, h0, scale=0.3, chunk_size=16,
                                                               gate_min=gate_min), make


def delta(gate, gate_min=None):
    def make(gen):
        k = F.normalize(torch.randn(B, T, H, K, generator=gen, device=DEV), dim=-1).requires_grad_()
        beta = torch.sigmoid(torch.randn(B, T, H, generator=gen, device=DEV)).requires_grad_()
        return [rnd(gen, B, T, H, K), k, rnd(gen, B, T, H, V), beta, gate_of(gen, gate), rnd(gen, B, H, K, V)]
    if gate_min is not None:  # gates floored at gate_min: the bounded kernels
        return lambda q, k, v, beta, g, h0: triton_ops.chunk_delta_rule(q, k, v, beta, g.clamp(min=gate_min), h0,
                                                                     gate_min=gate_min), make
    return lambda q, k, v, beta, g, h0: triton_ops.chunk_delta_rule(q, k, v, beta, g, h0), make  # default scale


def step(family, gate):
    def make(gen):
        g = gate_of(gen, gate, grad=False)
        g = g if g is None or g.dim() == 1 else g[:, :1]
        beta = torch.rand(B, 1, H, generator=gen, device=DEV) if family == "delta" else None
        return [rnd(gen, B, 1, H, K, grad=False), rnd(gen, B, 1, H, K, grad=False), rnd(gen, B, 1, H, V, grad=False),
                beta, g, rnd(gen, B, H, K, V, grad=False)]
    if family == "delta":
        return lambda q, k, v, beta, g, h0: triton_ops.recurrent_step_delta_rule(q, k, v, beta, g, h0), make
    return lambda q, k, v, beta, g, h0: triton_ops.recurrent_step_decay_additive(q, k, v, g, h0, 0.3), make


def logits(gen, grad=True):
    y = torch.randint(0, 300, (12,), generator=gen, device=DEV)
    y[::4] = -1
    return [rnd(gen, 12, 300, scale=3.0, grad=grad), rnd(gen, 12, 300, scale=3.0, grad=False), y]


# name, the operator the compiled graph must hold, fn, make(gen) -> fn's arguments
CASES = [(f"chunk_decay_additive-{gate}", "add_chunk_fwd", *additive(gate))
         for gate in ("none", "const", "head", "channel")]
CASES += [("chunk_decay_additive-channel-bounded", "add_chunk_fwd", *additive("channel", gate_min=-5.0))]
CASES += [(f"chunk_delta_rule-{gate}", "delta_rule_fwd", *delta(gate)) for gate in ("none", "const", "head", "channel")]
CASES += [("chunk_delta_rule-channel-bounded", "delta_rule_fwd", *delta("channel", gate_min=-5.0))]
CASES += [("recurrent_step_decay_additive", "recurrent_step_decay_additive", *step("additive", "channel")),
          ("recurrent_step_delta_rule", "recurrent_step_delta_rule", *step("delta", "head"))]
CASES += [
    ("short_conv", "short_conv_fwd", lambda x, w: triton_ops.short_conv(x, w),
     lambda gen: [rnd(gen, B, T, 3 * H * K), rnd(gen, 3 * H * K, 4)]),
    # q, k, v cut from a slice of a wider projection, q and k L2-normalized per head
    ("short_conv-qkv", "short_conv_fwd",
     lambda x, w: triton_ops.short_conv(x[..., : 3 * H * K], w, parts=3, l2_parts=2, head_dim=K),
     lambda gen: [rnd(gen, B, T, 3 * H * K + 8), rnd(gen, 3 * H * K, 4)]),
    ("rms_norm_gate", "norm_fwd", lambda x, w: triton_ops.rms_norm_gate(x, w),
     lambda gen: [rnd(gen, B, T, H, K), rnd(gen, K)]),
    # the gate a slice of a wider projection, as the mixers pass it
    ("rms_norm_gate-silu", "norm_fwd",
     lambda x, w, z: triton_ops.rms_norm_gate(x, w, z[..., H * K:].unflatten(-1, (H, K)), "silu"),
     lambda gen: [rnd(gen, B, T, H, K), rnd(gen, K), rnd(gen, B, T, 2 * H * K)]),
    ("l2_normalize", "norm_fwd", triton_ops.l2_normalize, lambda gen: [rnd(gen, B, T, H, K)]),
    ("softplus_decay-head", "log_decay_fwd", lambda a, A, b: triton_ops.softplus_decay(a[..., :H], A, b),
     lambda gen: [rnd(gen, B, T, H + 3), rnd(gen, H), rnd(gen, H)]),
    ("softplus_decay-channel", "log_decay_fwd", triton_ops.softplus_decay,
     lambda gen: [rnd(gen, B, T, H, K), rnd(gen, H), rnd(gen, H * K)]),
    ("sigmoid_decay-channel", "log_decay_fwd", lambda a, A, b: triton_ops.sigmoid_decay(a, A, b, -5.0),
     lambda gen: [rnd(gen, B, T, H, K), rnd(gen, H), rnd(gen, H * K)]),
    ("distill_loss", "distill_loss", lambda z, t, y: triton_ops.distill_loss(z, t, y, 0.7, 1.3, 2.0), logits),
    ("distill_loss-ce", "distill_loss", lambda z, t, y: triton_ops.distill_loss(z, None, y), logits),
    ("distill_loss_grad", "distill_loss", lambda z, t, y: triton_ops.distill_loss_grad(z, t, y, 0.7, 1.3, 2.0),
     lambda gen: logits(gen, grad=False)),
]


def outputs_and_grads(fn, args, seed=1, dynamic=()):
    """fn's outputs and the gradients of sum(out * cotangent) over its differentiable outputs with
    respect to every argument that requires grad (fixed random cotangents). dynamic: the indices
    of the arguments whose dim 1 torch.compile is to treat as dynamic."""
    leaves = [a.detach().clone().requires_grad_(a.requires_grad) if torch.is_tensor(a) else a for a in args]
    for i in dynamic:
        torch._dynamo.mark_dynamic(leaves[i], 1)
    outs = fn(*leaves)
    outs = [o for o in (outs if isinstance(outs, (tuple, list)) else (outs,)) if o is not None]
    diff = [o for o in outs if o.requires_grad]
    wrt = [x for x in leaves if torch.is_tensor(x) and x.requires_grad]
    grads = []
    if diff:
        gen = torch.Generator(DEV).manual_seed(seed)
        cots = [torch.randn(o.shape, generator=gen, device=DEV).to(o.dtype) for o in diff]
        grads = list(torch.autograd.grad(diff, wrt, cots))
    return [o.detach() for o in outs], grads


@pytest.mark.parametrize("name,op,fn,make", CASES, ids=[c[0] for c in CASES])
def test_compiled_equals_eager(inductor, name, op, fn, make):
    torch._dynamo.reset()
    args = make(torch.Generator(DEV).manual_seed(0))
    out, grads = outputs_and_grads(fn, args)
    counter = CompileCounterWithBackend("inductor")
    cout, cgrads = outputs_and_grads(torch.compile(fn, backend=counter, fullgraph=True), args)
    assert counter.frame_count == 1
    called = {str(n.target) for gm in counter.graphs for n in gm.graph.nodes if n.op == "call_function"}
    assert f"linearize.{op}.default" in called, called
    assert len(cout) == len(out) and len(cgrads) == len(grads)
    assert grads or not any(torch.is_tensor(a) and a.requires_grad for a in args)
    for i, (c, e) in enumerate(zip(cout + cgrads, out + grads)):
        assert c.dtype == e.dtype and c.shape == e.shape, (i, c.dtype, e.dtype, c.shape, e.shape)
        if SUMMED_OUTSIDE.get(name) == i:
            torch.testing.assert_close(c, e, rtol=1e-6, atol=0)
        else:
            assert torch.equal(c, e), f"{name}: result {i} differs by {(c.double() - e.double()).abs().max().item():.3g}"


# results that are not the operators' own but a PyTorch reduction of them, which eager PyTorch and
# Inductor may sum in different orders (seen on an AVX2 CPU: 3.1e-5 on a gradient of 314): the
# delta rule's constant gate comes in expanded to every position, so its gradient (result 6:
# o, ht, then dq, dk, dv, dbeta, dg) is the sum of the operator's per-position ones
SUMMED_OUTSIDE = {"chunk_delta_rule-const": 6}


@pytest.mark.parametrize("family", ["additive", "delta"])
def test_compiled_dynamic_length(inductor, family):
    """A length marked dynamic: one graph serves T = 20 and T = 45 (the fake implementations
    compute their shapes symbolically), with the eager numbers."""
    torch._dynamo.reset()
    fn, _ = additive("channel") if family == "additive" else delta("head")
    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(fn, backend=counter, fullgraph=True)
    b = 1  # one sequence: the lengths are the point
    for length in (20, 45):
        gen = torch.Generator(DEV).manual_seed(length)
        q, k, v, h0 = rnd(gen, b, length, H, K), rnd(gen, b, length, H, K), rnd(gen, b, length, H, V), rnd(gen, b, H, K, V)
        if family == "additive":
            args = [q, k, v, logdecay(gen, b, length, H, K), h0]
        else:
            k = F.normalize(k.detach(), dim=-1).requires_grad_()
            args = [q, k, v, torch.rand(b, length, H, generator=gen, device=DEV).requires_grad_(),
                    logdecay(gen, b, length, H), h0]
        out, grads = outputs_and_grads(fn, args)
        cout, cgrads = outputs_and_grads(compiled, args, dynamic=range(len(args) - 1))
        for c, e in zip(cout + cgrads, out + grads):
            assert torch.equal(c, e)
    assert counter.frame_count == 1


# --- (b) opcheck -------------------------------------------------------------------------------

def op_args(name):
    """The operator and its arguments (one sequence: opcheck runs each operator many times)."""
    gen = torch.Generator(DEV).manual_seed(2)
    B = 1
    q, k, v, h0 = rnd(gen, B, T, H, K), rnd(gen, B, T, H, K), rnd(gen, B, T, H, V), rnd(gen, B, H, K, V)
    kn = F.normalize(k.detach(), dim=-1).requires_grad_()
    beta = torch.sigmoid(torch.randn(B, T, H, generator=gen, device=DEV)).requires_grad_()
    gh, gk = logdecay(gen, B, T, H), logdecay(gen, B, T, H, K)
    do, dht = rnd(gen, B, T, H, V, grad=False), rnd(gen, B, H, K, V, grad=False)
    if name == "add_chunk_fwd-channel":
        return ops.add_chunk_fwd.default, (q, k, v, gk, h0, 0.3, 16, False)
    if name == "add_chunk_fwd-channel-bounded":  # the kernels' bounded path (logsigmoid gates are > -5)
        return ops.add_chunk_fwd.default, (q, k, v, gk, h0, 0.3, 16, True)
    if name == "add_chunk_fwd-none":
        return ops.add_chunk_fwd.default, (q, k, v, None, None, 0.3, 16, False)
    if name == "add_chunk_fwd-const":
        return ops.add_chunk_fwd.default, (q, k, v, logdecay(gen, H), h0, 0.3, 32, False)
    # the backward operators, as autograd runs them (inputs that do not require grad: they have
    # no derivative of their own)
    if name == "add_chunk_bwd-head":
        q, k, v, gh, h0 = (x.detach() for x in (q, k, v, gh, h0))
        _, _, gc, hs = ops.add_chunk_fwd(q, k, v, gh, h0, 0.3, 16, False)
        return ops.add_chunk_bwd.default, (do, dht, q, k, v, gh, h0, gc, hs, 0.3, 16, False, True)
    if name == "add_chunk_bwd-const-fixed":  # a decay that is not learned (RetNet's): no dg
        q, k, v, h0 = (x.detach() for x in (q, k, v, h0))
        g = logdecay(gen, H, grad=False)
        _, _, gc, hs = ops.add_chunk_fwd(q, k, v, g, h0, 0.3, 16, False)
        return ops.add_chunk_bwd.default, (do, dht, q, k, v, g, h0, gc, hs, 0.3, 16, False, False)
    if name == "delta_rule_fwd-channel":
        return ops.delta_rule_fwd.default, (q, kn, v, beta, gk, h0, 0.3, False)
    if name == "delta_rule_fwd-channel-bounded":  # the kernels' bounded path (logsigmoid gates are > -5)
        return ops.delta_rule_fwd.default, (q, kn, v, beta, gk, h0, 0.3, True)
    if name == "delta_rule_fwd-none":
        return ops.delta_rule_fwd.default, (q, kn, v, beta, None, None, 0.3, False)
    if name == "delta_rule_bwd-head":
        q, kn, v, beta, gh, h0 = (x.detach() for x in (q, kn, v, beta, gh, h0))
        _, _, *kept = ops.delta_rule_fwd(q, kn, v, beta, gh, h0, 0.3, False)  # gc, Ai, P, W, h, Vnew
        return ops.delta_rule_bwd.default, (do, None, q, kn, v, beta, gh, h0, *kept, 0.3, False)
    if name == "recurrent_step_delta_rule":
        x = [t.detach()[:, :1] for t in (q, kn, v, beta, gk)]
        return ops.recurrent_step_delta_rule.default, (*x, h0.detach(), 0.3)
    if name == "short_conv_fwd":
        return ops.short_conv_fwd.default, (rnd(gen, B, T, 3 * H * K), rnd(gen, 3 * H * K, 4), 3, 2, K)
    if name == "norm_fwd":
        return ops.norm_fwd.default, (q, rnd(gen, K), rnd(gen, B, T, H, K), 1.0 / K, 1e-5, 2)
    if name == "log_decay_fwd-softplus":
        return ops.log_decay_fwd.default, (rnd(gen, B, T, H, K), rnd(gen, H), rnd(gen, H * K), 0.0)
    if name == "log_decay_fwd-sigmoid":
        return ops.log_decay_fwd.default, (rnd(gen, B, T, H, K), rnd(gen, H), rnd(gen, H * K), -5.0)
    if name == "distill_loss":
        z, t, y = logits(gen)
        return ops.distill_loss.default, (z, t, y, 0.7, 1.3, 2.0, True)
    raise KeyError(name)


OPCHECKS = ["add_chunk_fwd-channel", "add_chunk_fwd-channel-bounded", "add_chunk_fwd-none", "add_chunk_fwd-const", "add_chunk_bwd-head",
            "add_chunk_bwd-const-fixed",
            "delta_rule_fwd-channel", "delta_rule_fwd-channel-bounded", "delta_rule_fwd-none", "delta_rule_bwd-head", "recurrent_step_delta_rule",
            "short_conv_fwd", "norm_fwd", "log_decay_fwd-softplus", "log_decay_fwd-sigmoid", "distill_loss"]


@pytest.mark.parametrize("name", OPCHECKS)
def test_opcheck(name):
    op, args = op_args(name)
    results = torch.library.opcheck(op, args)  # raises on the first failing check
    assert set(results) == {"test_schema", "test_autograd_registration", "test_faketensor",
                            "test_aot_dispatch_dynamic"}
    assert all(r == "SUCCESS" for r in results.values()), results


def test_delta_rule_keeps_its_inverse_in_the_inputs_dtype():
    """T = (I + A)^-1, kept for the backward, is stored in the inputs' dtype (it is only ever a
    product's operand), by the real operator and its fake alike; the final state h_T stays fp32.
    Checked on dtypes and shapes only: the interpreter's bf16 values are not meaningful on a CPU."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    gen = torch.Generator(DEV).manual_seed(4)
    q, k, v = (rnd(gen, 1, T, H, d, grad=False).bfloat16() for d in (K, K, V))
    k = F.normalize(k.float(), dim=-1).bfloat16()
    beta = torch.sigmoid(torch.randn(1, T, H, generator=gen, device=DEV)).bfloat16()
    g = logdecay(gen, 1, T, H, grad=False)
    args = (q, k, v, beta, g, None, 0.3, False)
    real = ops.delta_rule_fwd(*args)  # o, h_T, gc, Ai, P, W, h, Vnew
    with FakeTensorMode(allow_non_fake_inputs=True):
        fake = ops.delta_rule_fwd(*args)
    assert real[3].dtype == torch.bfloat16 and real[1].dtype == torch.float32
    assert [(x.dtype, x.shape) for x in real] == [(x.dtype, x.shape) for x in fake]


# --- (c) distill_loss against PyTorch in float64 ---------------------------------------------

def torch_distill_loss(z, t, y, ce_weight, kl_weight, temperature):
    """ce_weight * CE + kl_weight * T^2 KL(softmax(t / T) || softmax(z / T)), means over the rows
    with y >= 0, in float64 with F.cross_entropy and F.log_softmax."""
    z = z.double()
    ce = F.cross_entropy(z, y, ignore_index=-1)
    kl = torch.zeros((), dtype=torch.float64, device=z.device)
    if t is not None:
        keep = y >= 0
        lz, lt = F.log_softmax(z / temperature, -1), F.log_softmax(t.double() / temperature, -1)
        kl = (lt.exp() * (lt - lz)).sum(-1)[keep].mean() * temperature ** 2
    return ce_weight * ce + kl_weight * kl, ce, kl


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.mark.parametrize("teacher", [True, False])
def test_distill_loss_equals_torch_fp64(teacher):
    # V = 5000: two vocabulary blocks of 4096 per pass, the second one ragged
    gen = torch.Generator(DEV).manual_seed(3)
    N, Vv, cw, kw, temp = 10, 5000, 0.7, 1.3, 2.0
    z = 3 * torch.randn(N, Vv, generator=gen, device=DEV)
    t = 3 * torch.randn(N, Vv, generator=gen, device=DEV) if teacher else None
    y = torch.randint(0, Vv, (N,), generator=gen, device=DEV)
    y[::3] = -1  # rows 0, 3, 6, 9 do not count
    zl = z.clone().requires_grad_()
    loss, ce, kl = triton_ops.distill_loss(zl, t, y, cw, kw, temp)
    (1.7 * loss).backward()  # an incoming gradient != 1: the backward scales the kept gradient
    z64 = z.double().requires_grad_()
    rloss, rce, rkl = torch_distill_loss(z64, t, y, cw, kw, temp)
    (1.7 * rloss).backward()
    assert loss.requires_grad and not ce.requires_grad and not kl.requires_grad
    assert loss.dtype == ce.dtype == kl.dtype == torch.float32 and loss.shape == ()
    assert abs(loss.item() - rloss.item()) < 1e-5 * abs(rloss.item())
    assert abs(ce.item() - rce.item()) < 1e-5 * abs(rce.item())
    if teacher:
        assert rkl.item() > 0.1 and abs(kl.item() - rkl.item()) < 1e-5 * rkl.item()
    else:
        assert kl.item() == 0.0 and loss.item() == pytest.approx(cw * ce.item(), rel=1e-6)
    assert zl.grad.dtype == z.dtype and rel(zl.grad, z64.grad) < 1e-5, rel(zl.grad, z64.grad)
    assert torch.all(zl.grad[y < 0] == 0) and torch.all(zl.grad[y >= 0].abs().sum(-1) > 0)


def test_distill_loss_bf16_gradient_in_logits_dtype():
    gen = torch.Generator(DEV).manual_seed(4)
    z = (3 * torch.randn(8, 300, generator=gen, device=DEV)).bfloat16()
    t = (3 * torch.randn(8, 300, generator=gen, device=DEV)).bfloat16()
    y = torch.randint(0, 300, (8,), generator=gen, device=DEV)
    zl = z.clone().requires_grad_()
    loss, _, _ = triton_ops.distill_loss(zl, t, y, 1.0, 0.5, 1.5)
    loss.backward()
    z64 = z.double().requires_grad_()
    torch_distill_loss(z64, t, y, 1.0, 0.5, 1.5)[0].backward()
    assert zl.grad.dtype == torch.bfloat16
    assert rel(zl.grad, z64.grad) < 1e-2  # bf16 rounding of the stored gradient


def test_distill_loss_no_row_counts():
    """Every target -1: loss, ce, kl and the gradient are 0 (not NaN, as a mean over no rows)."""
    gen = torch.Generator(DEV).manual_seed(5)
    zl = torch.randn(4, 50, generator=gen, device=DEV).requires_grad_()
    loss, ce, kl = triton_ops.distill_loss(zl, torch.randn(4, 50, generator=gen, device=DEV),
                                        torch.full((4,), -1, device=DEV))
    loss.backward()
    assert loss.item() == ce.item() == kl.item() == 0.0 and torch.all(zl.grad == 0)


# --- (d) gradients of unused outputs: None, not tensors of zeros ----------------------------

FNS = {name: (fn, make) for name, _, fn, make in CASES}


@pytest.mark.parametrize("name", ["chunk_decay_additive-channel", "chunk_delta_rule-channel-bounded", "distill_loss"])
def test_the_backward_fills_no_zeros_for_outputs_nobody_reads(name):
    # autograd hands a tensor of zeros to the backward for every output without a gradient unless
    # the operator asks for None: seven a delta-rule layer (its state and the six it keeps), and
    # an [N, V] one for the loss's kept gradient
    fn, make = FNS[name]
    args = make(torch.Generator(DEV).manual_seed(0))
    out = fn(*args)[0]
    wrt = [a for a in args if torch.is_tensor(a) and a.requires_grad]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        grads = torch.autograd.grad(out, wrt, torch.ones_like(out))
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert not [e.key for e in prof.key_averages() if e.key in ("aten::zeros", "aten::zero_", "aten::zeros_like")]


@pytest.mark.parametrize("name", ["chunk_decay_additive-channel", "chunk_delta_rule-head"])
def test_the_final_state_alone_takes_its_gradient(name):
    # the output unused: its gradient arrives as None, and the backward stands zeros in for it
    fn, make = FNS[name]
    args = make(torch.Generator(DEV).manual_seed(1))
    o, ht = fn(*args)
    wrt = [a for a in args if torch.is_tensor(a) and a.requires_grad]
    dht = torch.randn(ht.shape, generator=torch.Generator(DEV).manual_seed(2), device=DEV)
    alone = torch.autograd.grad(ht, wrt, dht, retain_graph=True, allow_unused=True)
    both = torch.autograd.grad([o, ht], wrt, [torch.zeros_like(o), dht], allow_unused=True)
    assert any(a is not None and a.abs().sum() > 0 for a in alone)
    for a, b in zip(alone, both):
        assert (a is None and (b is None or not b.any())) or torch.equal(a, b)


def test_compiled_code_is_keyed_by_this_source():
    # torch.compile's caches see a custom operator by name: without the file's text in their key,
    # a graph compiled before an edit of an operator's autograd calls the old backward
    digest = hashlib.sha256(open(triton_ops.__file__, "rb").read()).hexdigest()[:16]
    assert f"linearize-{digest}" in torch.compiler.config.cache_key_tag
