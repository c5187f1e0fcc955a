"""The fused training glue of triton_ops.py section 5: short_conv, the distillation loss and the norms.

short_conv against mixers.ShortConv's PyTorch form (F.conv1d, then SiLU) in fp64: output and the
gradients of x and the weights. distill_loss_grad against autograd through distill.cross_entropy and
distill.kl_per_token: loss, its parts and the gradient of the student's logits; distill_loss and
head_loss (the LM heads applied a slice of rows at a time) against distill.distill_loss, the loss
that trains on the torch backend, through autograd. On the CPU the
kernels run in Triton's interpreter, in fp32, at shapes that cut blocks; on a GPU in bf16 at
training shapes.
"""

import inspect
import os
import shutil
import subprocess
import sys

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

pytest.importorskip("triton")
import distill  # noqa: E402
import triton_ops  # noqa: E402
import mixers  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import launch_sweep  # noqa: E402

CUDA = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"
DEV = "cuda" if CUDA else "cpu"  # the small fp32 tests run compiled there, in the interpreter here
gpu = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def conv_reference(x, w):
    """mixers.ShortConv's PyTorch path in fp64: y and the gradients of (x, w) for a fixed dy."""
    conv = mixers.ShortConv(*w.shape).double()
    with torch.no_grad():
        conv.weight.copy_(w)
    xd = x.detach().double().requires_grad_()
    y, _ = conv(xd)
    dy = torch.randn_like(y, generator=torch.Generator().manual_seed(1))
    return y, dy, torch.autograd.grad(y, (xd, conv.weight), dy)


def tiny_layer(mixer):
    """Layer 0 of a tiny student (width 32, two heads of 16) with a random short conv, on DEV."""
    import model

    cfg = model.Config(vocab_size=64, n_layer=1, n_embd=32, n_head=2, n_kv_head=1, intermediate_size=64,
                       mixer=mixer)
    torch.manual_seed(0)
    layer = mixers.LAYERS[mixer](cfg, 0).to(DEV)
    with torch.no_grad():
        layer.conv.weight.normal_(0, 0.5)
    return layer, cfg


def conv_kernel(x, w, dy):
    x, w = x.detach().to(DEV).requires_grad_(), w.detach().float().to(DEV).requires_grad_()
    y = triton_ops.short_conv(x, w)
    return y.cpu(), [g.cpu() for g in torch.autograd.grad(y, (x, w), dy.to(DEV, y.dtype))]


@pytest.mark.parametrize("rows", sorted({16, triton_ops._CONV_BT, 64}))
@pytest.mark.parametrize("B,T,D,S", [(2, 70, 80, 4), (1, 2, 5, 4), (1, 64, 64, 3)])
def test_short_conv_matches_pytorch(B, T, D, S, rows, monkeypatch):
    # T = 70 and D = 80 cut time blocks and a channel block; T = 2 < S - 1 starts inside the padding;
    # at any rows a program (scripts/launch_sweep.py times them)
    monkeypatch.setattr(triton_ops, "_CONV_BT", rows)
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(B, T, D, generator=gen), torch.randn(D, S, generator=gen)
    y_ref, dy, (dx_ref, dw_ref) = conv_reference(x, w)
    y, (dx, dw) = conv_kernel(x, w, dy)
    assert rel(y, y_ref) < 1e-6 and rel(dx, dx_ref) < 1e-6 and rel(dw, dw_ref) < 1e-6


@pytest.mark.parametrize("op,shape,block,warps", [
    ("conv", ["--T=40", "--H=2"], "_CONV_BT=16,48,64", "_CONV_WARPS=2"),
    ("head", ["--T=40", "--H=2"], "_ADD_STATE_BV=16,48,32", "_ADD_WARPS=2"),
    ("norm", ["--T=40", "--H=2", "--D=16"], "_NORM_BLOCK=256,1000,1024", "_NORM_WARPS=2"),
    ("loss", ["--T=40", "--V=3000"], "_LOSS_BV=1024,1000,4096", "_LOSS_WARPS=8"),
    ("gdn", ["--T=40", "--H=1"], "_DELTA_BV=32,48,16", "_DELTA_WARPS=2"),
])
@pytest.mark.skipif(CUDA, reason="interpreter only: the suite compiles the kernels on a GPU, where the sweep itself "
                    "checks every combination against the defaults (and Triton 3.6's interpreter cannot run these "
                    "kernels' loops over a launch argument with NumPy 2.4)")
def test_the_launch_sweep_finds_each_operator_the_same_at_every_launch_shape(op, shape, block, warps):
    # scripts/launch_sweep.py untimed in the interpreter, at shapes where each block differs from
    # the default's (time blocks cut, value blocks narrower, rows grouped otherwise, vocabulary in
    # more steps); the middle value (not a power of two) must fail, or the block constant never
    # reached the kernels (the interpreter ignores warps: their constants run unchecked here)
    r = subprocess.run([sys.executable, "scripts/launch_sweep.py", f"--op={op}", "--B=1", *shape, f"--set={block}",
                        f"--set={warps}"], cwd=ROOT, capture_output=True, text=True,
                       env={**os.environ, "TRITON_INTERPRET": "1"})
    lines = r.stdout.splitlines()[1:]
    assert r.returncode == 0 and len(lines) == 4 and "(the defaults)" in lines[0], r.stdout + r.stderr
    name, values = block.split("=")
    bad = f"{name}={values.split(',')[1]} "
    assert [line for line in lines if line.startswith(bad)][0].startswith(f"{bad}{warps}: failed:"), r.stdout
    ran = [line for line in lines if not line.startswith(bad)]
    assert len(ran) == 3 and all(float(line.split("max diff ")[1].split()[0]) < 1e-6 for line in ran), r.stdout


def test_the_launch_sweep_stops_after_a_combination_loses_the_gpu(monkeypatch):
    # a kernel that faults (an illegal address) leaves CUDA's context failing every later call:
    # the sweep reports the combinations after it as not run, not as failures of their own, goes
    # on past a failure that leaves the device usable, and puts the constants back
    x = torch.randn(4, 8, requires_grad=True)

    def fn(x):
        if triton_ops._CONV_BT in (64, 128):
            raise RuntimeError("an illegal memory access was encountered")
        return [x * 2]

    default = triton_ops._CONV_BT
    values = [default] + [v for v in (128, 64, 16) if v != default] + [8]
    monkeypatch.setattr(launch_sweep, "case", lambda *a, **k: ([x], fn))
    monkeypatch.setattr(launch_sweep, "device_usable", lambda: triton_ops._CONV_BT != 64)
    monkeypatch.setattr(launch_sweep.triton.testing, "do_bench", lambda f, **k: (f(), 1.0)[1])
    got = {c["_CONV_BT"]: fwd for c, fwd, *_ in launch_sweep.sweep("conv", 1, 4, 1, 8, {"_CONV_BT": values}, timed=True)}
    assert got[default] == 1.0 and got[128].startswith("failed: an illegal memory access") and got[64] == got[128]
    assert got[16] == got[8] == "not run: the GPU's context was lost at _CONV_BT=64"
    assert triton_ops._CONV_BT == default


def test_the_launch_sweep_sums_the_kernels_device_time(monkeypatch, capsys):
    # with --kernels each combination's kernels follow it, the slowest first, and their sum: the
    # device's time, which a host-timed eager call may not show; none where the profiler failed
    runs = [({"_CONV_BT": 32}, 0.5, 1.5, 0.0, {"a": 0.25, "b": 0.625}),
            ({"_CONV_BT": 64}, 0.5, 1.5, 0.0, {"(no kernel times: the profiler failed)": float("nan")})]
    monkeypatch.setattr(launch_sweep, "sweep", lambda *a, **k: iter(runs))
    monkeypatch.setattr(sys, "argv", ["launch_sweep.py", "--op=conv", "--kernels"])
    launch_sweep.main()
    out = capsys.readouterr().out.splitlines()
    at = out.index("_CONV_BT=32: 0.500 1.500  max diff 0.0e+00  (the defaults)")
    assert out[at + 1:at + 4] == ["      0.625  b", "      0.250  a",
                                  "      0.875  the kernels together: the device's time of a forward + backward"]
    assert out[at + 4].startswith("_CONV_BT=64: ") and "together" not in out[at + 5] and len(out) == at + 6


@pytest.mark.parametrize("H,D,l2,t0", [(3, 16, 2, 0), (2, 24, 2, 0), (2, 64, 0, 0), (1, 8, 2, 3)])
def test_short_conv_cuts_q_k_v_and_normalizes_heads(H, D, l2, t0):
    # the fused form the layers use: x a slice of a wider projection (strided rows; with t0 > 0
    # also cut in time, so that sequences are not T rows apart), y cut into contiguous q, k, v,
    # q and k L2-normalized per head (D = 24 pads its heads to 32 lanes); against the PyTorch
    # conv, view, F.normalize in fp64
    import torch.nn.functional as F

    gen = torch.Generator().manual_seed(0)
    B, T, S = 2, 70, 4
    big, w = torch.randn(B, T + t0, 3 * H * D + 5, generator=gen).double(), torch.randn(3 * H * D, S, generator=gen)
    x = big.requires_grad_()[:, t0:, : 3 * H * D]
    conv = mixers.ShortConv(3 * H * D, S).double()
    with torch.no_grad():
        conv.weight.copy_(w)
    q, k, v = conv(x)[0].view(B, T, 3, H, D).unbind(2)
    if l2:
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
    refs = [t.reshape(B, T, H * D) for t in (q, k, v)]
    dys = [torch.randn(r.shape, generator=gen).double() for r in refs]
    grads_ref = torch.autograd.grad(refs, (big, conv.weight), dys)
    bigk = big.detach().float().to(DEV).requires_grad_()
    wk = w.to(DEV).requires_grad_()
    ys = triton_ops.short_conv(bigk[:, t0:, : 3 * H * D], wk, parts=3, l2_parts=l2, head_dim=D)
    assert all(y.is_contiguous() and y.shape == (B, T, H * D) for y in ys)
    grads = torch.autograd.grad(ys, (bigk, wk), [d.float().to(DEV) for d in dys])
    assert all(rel(a.cpu(), b) < 1e-6 for a, b in zip(ys, refs))
    assert all(rel(a.cpu(), b) < 1e-6 for a, b in zip(grads, grads_ref))


@pytest.mark.parametrize("mixer", mixers.MIXERS)
def test_layer_heads_keep_the_tail_for_decoding(mixer):
    # a prefill through the kernel path (taken on CUDA) gives the q, k, v and the conv tail of
    # the PyTorch path, also when the prompt is shorter than the tail
    layer, _ = tiny_layer(mixer)
    for T in (2, 9):
        qkv = torch.randn(1, T, 3 * 32, device=DEV)
        out = {}
        for on in (True, False):
            cache = {}
            out[on] = [t.contiguous() for t in layer.heads(qkv, cache, "triton" if on else "torch")] + [cache["conv"]]
        assert all(a.shape == b.shape for a, b in zip(out[True], out[False]))
        torch.testing.assert_close(out[True], out[False])


def test_the_backends_are_twins():
    # what a layer calls with backend="triton" (@triton_twin): in triton_ops.py under the same
    # name and signature
    assert len(mixers.TWINS) >= 10
    for name, fn in mixers.TWINS.items():
        assert fn.__name__ == name
        assert inspect.signature(getattr(triton_ops, name)) == inspect.signature(fn), name


class Stop(Exception):
    pass


@pytest.mark.parametrize("mixer", mixers.MIXERS)
def test_in_projection_pads_rows_and_changes_nothing(mixer):
    # at SmolLM2-135M's widths (in_proj holds 1,728 to 2,377 rows) the triton form's parts are
    # slices of products whose row strides divide by 16 and are a whole number of Inductor's
    # padding alignment in bf16 and fp32 (so that a compiled step keeps the eager strides and
    # copies nothing); with a gradient asked for, q, k, v come from a product of their own; the
    # values, and the gradients of x and the weight, are F.linear's and a split, the torch form
    import model
    from torch._inductor import config as inductor

    cfg = model.Config(n_layer=1, vocab_size=64, mixer=mixer)
    torch.manual_seed(0)
    layer = mixers.LAYERS[mixer](cfg, 0).to(DEV)
    w, widths = layer.in_proj.weight, list(layer.widths.values())
    rows, align = w.shape[0], inductor.padding_alignment_bytes
    x = torch.randn(2, 8, cfg.n_embd, generator=torch.Generator().manual_seed(0)).to(DEV).requires_grad_()
    for grad in (False, True):  # the last pair, with gradients, is checked below
        with torch.set_grad_enabled(grad):
            parts, ref = triton_ops.in_projection(x, w, widths), mixers.in_projection(x, w, widths)
        strides = [p.stride(1) for p in parts]
        if grad and len(widths) > 1:
            rest = rows - widths[0]
            assert strides == [widths[0]] + [rest + (-rest % triton_ops.ROW_ALIGN)] * (len(widths) - 1)
        else:
            assert strides == [rows + (-rows % triton_ops.ROW_ALIGN)] * len(widths)
        assert all(s % 16 == 0 and s * size % align == 0 for s in strides for size in (2, 4)), (strides, align)
        assert [p.shape[-1] for p in parts] == widths
        for p, r in zip(parts, ref):
            torch.testing.assert_close(p, r, rtol=1e-6, atol=1e-6)
    gen = torch.Generator().manual_seed(1)
    dh = [torch.randn(r.shape, generator=gen).to(DEV) for r in ref]
    for got, want in zip(torch.autograd.grad(parts, (x, w), dh), torch.autograd.grad(ref, (x, w), dh)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    seen = []

    def heads(qkv, cache, backend):  # the first kernel's input: recorded, then the forward stops
        seen.append(qkv.stride(1))
        raise Stop

    layer.backend, layer.heads = "triton", heads
    with pytest.raises(Stop):
        layer(x, None)
    assert seen == [parts[0].stride(1)]


def loss_reference(z, t, y, ce_weight, kl_weight, temperature):
    zd = z.detach().double().requires_grad_()
    ce = distill.cross_entropy(zd.double()[None], y[None])
    kl = distill.kl_per_token(t.double()[None], zd[None], temperature, mask=y[None] >= 0) if t is not None else 0
    loss = ce_weight * ce + kl_weight * kl
    return loss, ce, kl, torch.autograd.grad(loss, zd)[0]


def loss_kernel(z, t, y, ce_weight=1.0, kl_weight=1.0, temperature=1.0):
    ce, kl, dz = triton_ops.distill_loss_grad(z.to(DEV), None if t is None else t.to(DEV), y.to(DEV), ce_weight,
                                           kl_weight, temperature)
    return (ce_weight * ce + kl_weight * kl).cpu(), ce.cpu(), kl.cpu(), dz.cpu()


@pytest.mark.parametrize("temperature", [1.0, 2.0])
@pytest.mark.parametrize("V", [37, 5000])  # 5000: a second block of the vocabulary, cut
def test_distill_loss_matches_ce_plus_kl(V, temperature):
    gen = torch.Generator().manual_seed(0)
    z, t = 3 * torch.randn(12, V, generator=gen), 3 * torch.randn(12, V, generator=gen)
    y = torch.randint(0, V, (12,), generator=gen)
    y[:3] = -1  # rows that do not count
    loss_r, ce_r, kl_r, g_r = loss_reference(z, t, y, 0.7, 1.3, temperature)
    loss, ce, kl, g = loss_kernel(z, t, y, 0.7, 1.3, temperature)
    assert abs(loss.item() - loss_r.item()) < 1e-5 * loss_r.item()
    assert abs(ce.item() - ce_r.item()) < 1e-5 * ce_r.item() and abs(kl.item() - kl_r.item()) < 1e-5 * kl_r.item()
    assert rel(g, g_r) < 1e-5 and g[:3].abs().max() == 0
    loss, ce, kl, g = loss_kernel(z, None, y)  # cross-entropy alone
    loss_r, ce_r, _, g_r = loss_reference(z, None, y, 1.0, 0.0, 1.0)
    assert abs(loss.item() - ce_r.item()) < 1e-5 * ce_r.item() and kl.item() == 0 and rel(g, g_r) < 1e-5


def test_fused_distill_loss_is_distill_loss():
    # triton_ops.distill_loss (the fused kernel) against distill.distill_loss, the definition that
    # trains on the torch backend (cross_entropy + kl_per_token through autograd): the same loss
    # and parts, the same gradient
    gen = torch.Generator().manual_seed(0)
    z, t = torch.randn(2, 5, 300, generator=gen), torch.randn(2, 5, 300, generator=gen)
    y = torch.randint(0, 300, (2, 5), generator=gen)
    y[0, 0] = -1
    out = {}
    for fused in (True, False):
        zz = z.to(DEV).requires_grad_()
        if fused:
            loss, ce, kl = triton_ops.distill_loss(zz.flatten(0, 1), t.to(DEV).flatten(0, 1), y.to(DEV).flatten(),
                                                   0.5, 2.0, 1.5)
        else:
            loss, ce, kl = distill.distill_loss(zz, t.to(DEV), y.to(DEV), 0.5, 2.0, 1.5)
        (3 * loss).backward()
        out[fused] = [v.detach().cpu() for v in (loss, ce, kl, zz.grad)]
    assert all(rel(a, b) < 1e-5 for a, b in zip(out[True], out[False]))


@pytest.mark.parametrize("rows", [1, 3, 7, 1000])  # one row, slices that do and do not tile B*T, one slice
@pytest.mark.parametrize("teacher", [True, False])
def test_head_loss_in_slices_is_distill_loss_of_the_whole_logits(rows, teacher):
    # triton_ops.head_loss (the stage-3, sft and lm loss on the triton backend: the LM heads
    # applied a slice of rows at a time inside the fused kernel) against distill.distill_loss on
    # h @ W.T made whole, through autograd: loss, parts, and the gradients of h and of W, with
    # rows that do not count, in every slicing
    gen = torch.Generator().manual_seed(0)
    h, w = torch.randn(2, 5, 16, generator=gen), torch.randn(300, 16, generator=gen)
    th, tw = torch.randn(2, 5, 16, generator=gen), torch.randn(300, 16, generator=gen)
    y = torch.randint(0, 300, (2, 5), generator=gen)
    y[0, :2] = -1
    out = {}
    for fused in (True, False):
        hh, ww = h.to(DEV).requires_grad_(), w.to(DEV).requires_grad_()
        t = (th.to(DEV), tw.to(DEV)) if teacher else (None, None)
        weights = dict(ce_weight=0.5, kl_weight=2.0, temperature=1.5) if teacher else {}
        if fused:
            loss, ce, kl = triton_ops.head_loss(hh, ww, y.to(DEV), *t, rows=rows, **weights)
        else:
            t_logits = t[0] @ t[1].t() if teacher else None
            loss, ce, kl = distill.distill_loss(hh @ ww.t(), t_logits, y.to(DEV), **weights)
        assert not ce.requires_grad and not kl.requires_grad
        (3 * loss).backward()
        out[fused] = [v.detach().cpu() for v in (loss, ce, kl, hh.grad, ww.grad)]
    assert all(rel(a, b) < 1e-5 for a, b in zip(out[True][:2] + out[True][3:], out[False][:2] + out[False][3:]))
    assert (out[True][2] - out[False][2]).abs().item() < 1e-5 * max(1.0, out[False][2].abs().item())
    assert out[True][3][0, :2].abs().max() == 0  # rows without a target give h no gradient


@pytest.mark.parametrize("teacher", [True, False])
def test_head_loss_adds_the_heads_gradient_in_fp32(teacher):
    # under autocast each slice's logits and their gradient are bf16; the slice's share of the LM
    # head's gradient goes into the fp32 sum unrounded, so how the rows are sliced moves that
    # gradient by fp32 rounding alone (rounded to bf16 a slice at a time, ten slices moved it by
    # about 1e-3 relative)
    gen = torch.Generator().manual_seed(0)
    h, w = torch.randn(2, 5, 16, generator=gen), torch.randn(300, 16, generator=gen)
    th, tw = torch.randn(2, 5, 16, generator=gen), torch.randn(300, 16, generator=gen)
    y = torch.randint(0, 300, (2, 5), generator=gen).to(DEV)
    t = (th.to(DEV), tw.to(DEV)) if teacher else (None, None)
    grads = []
    for rows in (1, 1000):  # ten slices of a row, one of them all
        ww = w.to(DEV).requires_grad_()
        with torch.autocast(DEV, dtype=torch.bfloat16):
            loss, _, _ = triton_ops.head_loss(h.to(DEV), ww, y, *t, rows=rows)
        grads += torch.autograd.grad(loss, ww)
    assert grads[0].dtype == torch.float32 and rel(grads[0], grads[1]) < 1e-5


@gpu
def test_short_conv_bf16_on_gpu():
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(4, 2048, 1728, generator=gen), torch.randn(1728, 4, generator=gen) / 2
    y_ref, dy, (dx_ref, dw_ref) = conv_reference(x, w)
    y, (dx, dw) = conv_kernel(x.bfloat16(), w, dy)
    # bf16 storage of x, y, dx: about 2^-9 relative per element
    assert rel(y, y_ref) < 1e-2 and rel(dx, dx_ref) < 1e-2 and rel(dw, dw_ref) < 1e-2


def test_stage_metrics_through_the_loss_kernel_are_those_of_the_definitions():
    # evaluations on the triton backend compare the student with the teacher through the loss's
    # kernel; on torch through cross_entropy and kl_per_token: the same numbers, rows in slices
    gen = torch.Generator().manual_seed(0)
    h, th, w, tw = (torch.randn(*s, generator=gen) for s in ((2, 9, 8), (2, 9, 8), (37, 8), (37, 8)))
    y = torch.randint(0, 37, (2, 9), generator=gen)
    y[1, 5:] = -1
    want = distill.compare(h, w, th, tw, y, rows=4, backend="torch")
    got = distill.compare(*(a.to(DEV) for a in (h, w, th, tw, y)), rows=4, backend="triton")
    assert got.keys() == want.keys() and all(got[k] == pytest.approx(want[k], rel=1e-5) for k in want)


@gpu
def test_distill_loss_bf16_on_gpu():
    gen = torch.Generator().manual_seed(0)
    z, t = 3 * torch.randn(2048, 49152, generator=gen), 3 * torch.randn(2048, 49152, generator=gen)
    z, t = z.bfloat16().float(), t.bfloat16().float()  # the values bf16 logits can hold
    y = torch.randint(0, 49152, (2048,), generator=gen)
    y[:100] = -1
    loss_r, ce_r, kl_r, g_r = loss_reference(z, t, y, 1.0, 1.0, 1.0)
    loss, ce, kl, g = loss_kernel(z.bfloat16(), t.bfloat16(), y, 1.0, 1.0, 1.0)
    assert abs(ce.item() - ce_r.item()) < 1e-4 * ce_r.item() and abs(kl.item() - kl_r.item()) < 1e-4 * kl_r.item()
    assert rel(g, g_r) < 1e-2  # the gradient is stored in bf16


@pytest.mark.parametrize("act", [None, "silu", "sigmoid"])
@pytest.mark.parametrize("N,D", [(37, 64), (5, 576)])  # 576: a row that is not a power of two
def test_rms_norm_gate_matches_pytorch(N, D, act):
    import model

    gen = torch.Generator().manual_seed(0)
    x, z, dy = (torch.randn(N, D, generator=gen, dtype=torch.float64) for _ in range(3))
    norm = model.RMSNorm(D, 1e-5).double()
    with torch.no_grad():
        norm.weight.normal_(generator=gen)
    xr, zr = x.clone().requires_grad_(), z.clone().requires_grad_()
    y_ref = norm(xr) * {None: lambda a: 1, "silu": torch.nn.functional.silu, "sigmoid": torch.sigmoid}[act](zr)
    refs = torch.autograd.grad(y_ref, (xr, norm.weight) + ((zr,) if act else ()), dy)
    xk, zk = x.float().to(DEV).requires_grad_(), z.float().to(DEV).requires_grad_()
    w = norm.weight.detach().float().to(DEV).requires_grad_()
    y = triton_ops.rms_norm_gate(xk, w, zk if act else None, act)
    grads = torch.autograd.grad(y, (xk, w) + ((zk,) if act else ()), dy.float().to(DEV))
    y, grads = y.cpu(), [g.cpu() for g in grads]
    assert rel(y, y_ref) < 1e-6 and all(rel(g, r) < 1e-5 for g, r in zip(grads, refs))


def test_rms_norm_gate_reads_a_strided_gate():
    # the layers' gate z is a slice of the stacked projection: the same result as a contiguous z
    gen = torch.Generator().manual_seed(0)
    B, T, H, D = 2, 5, 3, 16
    x, dy = torch.randn(B, T, H, D, generator=gen), torch.randn(B, T, H, D, generator=gen)
    big, w = torch.randn(B, T, H * D + 7, generator=gen), torch.randn(D, generator=gen)
    out = []
    for strided in (True, False):
        xk, bigk, wk = (t.clone().to(DEV).requires_grad_() for t in (x, big, w))
        z = bigk[..., : H * D].reshape(B, T, H, D)
        y = triton_ops.rms_norm_gate(xk, wk, z if strided else z.contiguous(), "silu")
        out.append([y] + list(torch.autograd.grad(y, (xk, bigk, wk), dy.to(DEV))))
    assert all(rel(a.cpu(), b.cpu()) < 1e-6 for a, b in zip(*out))


def test_l2_normalize_matches_f_normalize():
    gen = torch.Generator().manual_seed(0)
    x, dy = torch.randn(2, 7, 3, 64, generator=gen), torch.randn(2, 7, 3, 64, generator=gen)
    x[0, 0, 0] = 0  # a zero row stays zero
    xr = x.double().requires_grad_()
    y_ref = torch.nn.functional.normalize(xr, dim=-1)
    (dx_ref,) = torch.autograd.grad(y_ref, xr, dy.double())
    xk = x.to(DEV).requires_grad_()
    y = triton_ops.l2_normalize(xk)
    (dx,) = torch.autograd.grad(y, xk, dy.to(DEV))
    y, dx = y.cpu(), dx.cpu()
    assert rel(y, y_ref) < 1e-6 and rel(dx, dx_ref) < 1e-5 and y[0, 0, 0].abs().max() == 0


@pytest.mark.parametrize("kind", ["softplus", "sigmoid"])
@pytest.mark.parametrize("shape,strided", [((2, 70, 3), True), ((1, 5, 2, 24), False)])
def test_log_decays_match_pytorch(kind, shape, strided):
    # Gated DeltaNet's and KDA's gates (a [B, T, H] from a slice of a wider projection, or per
    # channel): Mamba-2's softplus decay with pre-activations past F.softplus's threshold of 20,
    # and the bounded sigmoid decay saturated both ways, against mixers' PyTorch forms in fp64
    gen = torch.Generator().manual_seed(0)
    H, HK = shape[2], shape[2] * (shape[3] if len(shape) == 4 else 1)
    # the sigmoid's pre-activations A x stay within fp32's exp (no overflow in Triton's interpreter)
    big = (8 if kind == "softplus" else 2) * torch.randn(shape[0], shape[1], HK + 7, generator=gen, dtype=torch.float64)
    A_log, dt = torch.randn(H, generator=gen, dtype=torch.float64), torch.randn(HK, generator=gen, dtype=torch.float64)
    big[0, 0, 0], big[0, 1, 0] = (30.0, -25.0) if kind == "softplus" else (300.0, -8.0)

    def run(big, A_log, dt, kern):
        a = big[..., :HK]
        a = a.view(shape) if strided else a.contiguous().view(shape)
        f = triton_ops if kern else mixers
        return f.softplus_decay(a, A_log, dt) if kind == "softplus" else f.sigmoid_decay(a, A_log, dt, -5.0)

    leaves = [t.clone().requires_grad_() for t in (big, A_log, dt)]
    g_ref = run(*leaves, False)
    dg = torch.randn(g_ref.shape, generator=gen, dtype=torch.float64)
    grads_ref = torch.autograd.grad(g_ref, leaves, dg)
    leaves = [t.float().to(DEV).requires_grad_() for t in (big, A_log, dt)]
    g = run(*leaves, True)
    grads = torch.autograd.grad(g, leaves, dg.float().to(DEV))
    assert g.dtype == torch.float32 and rel(g.cpu(), g_ref) < 1e-6
    # fp32 sums over rows (dA_log, ddt_bias): seen up to 2.6e-7 for softplus, 2.2e-6 for the sigmoid
    assert all(rel(a.cpu(), b) < (1e-6 if kind == "softplus" else 1e-5) for a, b in zip(grads, grads_ref))
    if kind == "softplus":  # where 1 + exp(x) rounds to 1, the kernel keeps exp(x)
        assert g.flatten()[HK] < 0 and abs(g.flatten()[HK].item() / g_ref.flatten()[HK].item() - 1) < 1e-5
    else:  # inside (floor, 0), and at the floor where the sigmoid saturates
        assert (g >= -5.0).all() and (g <= 0).all() and g.min() < -4.9


@pytest.mark.parametrize("mixer", mixers.MIXERS)
def test_mixer_layers_give_the_same_on_the_kernel_path(mixer):
    # every kernel a layer calls on a GPU (recurrence, short conv, norms), here in the interpreter,
    # against the same layer on the PyTorch path: output and all parameter gradients
    import model

    layer, cfg = tiny_layer(mixer)
    x = torch.randn(2, 21, 32, device=DEV)
    rope = model.rope_cos_sin(torch.arange(21), cfg.head_dim, cfg.rope_theta, device=DEV)
    out = {}
    for on in (True, False):
        layer.backend = "triton" if on else "torch"
        layer.zero_grad()
        y = layer(x, rope)
        y.square().sum().backward()
        out[on] = [y.detach()] + [p.grad.clone() for p in layer.parameters()]
    tol = 1e-4 if DEV == "cpu" else 0.02  # a GPU: tf32 products in the additive family's kernels
    assert all(rel(a, b) < tol for a, b in zip(out[True], out[False]))


@pytest.mark.parametrize("mixer", mixers.MIXERS)
def test_layer_prefill_then_decode_on_the_kernel_path(mixer):
    # a prompt through the kernel path (conv and its tail, chunked recurrence) then two tokens
    # through the fused decoding steps: the same outputs as the whole sequence in one pass
    import model

    layer, cfg = tiny_layer(mixer)
    x = torch.randn(1, 11, 32, device=DEV)
    cos, sin = model.rope_cos_sin(torch.arange(11), cfg.head_dim, cfg.rope_theta, device=DEV)
    layer.backend = "torch"
    with torch.no_grad():
        ref = layer(x, model.Rope(cos, sin))
    layer.backend = "triton"
    cache = {}
    with torch.no_grad():
        ys = [layer(x[:, :9], model.Rope(cos[:9], sin[:9]), cache)]
        for t in (9, 10):
            ys.append(layer(x[:, t : t + 1], model.Rope(cos[t : t + 1], sin[t : t + 1]), cache))
    assert rel(torch.cat(ys, 1).cpu(), ref.cpu()) < (1e-4 if DEV == "cpu" else 0.02)


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None and not CUDA,
                    reason="torch.compile on a CPU needs a C compiler")
@pytest.mark.parametrize("stage", ["1", "2", "3", "lm"])
def test_a_student_compiles_whole_on_the_triton_backend(stage):
    # the kernels are custom operators: torch.compile(fullgraph=True) of a student's stage loss
    # module (conv, recurrence, norms, decay, the LM head's fused loss) has no graph break, and
    # computes the same loss and gradients
    import checkpoint
    import model

    torch.manual_seed(0)
    cfg = model.Config(vocab_size=64, n_layer=1, n_embd=32, n_head=2, n_kv_head=1, intermediate_size=64)
    teacher = model.SmolLM2(cfg).to(DEV)
    student = checkpoint.student_from_teacher(teacher, "gated_deltanet").set_backend("triton")
    x = torch.randint(0, 64, (2, 40), device=DEV)
    t_out = distill.teacher_pass(teacher, x, stage)
    t_compiled = torch.compile(distill.teacher_pass, fullgraph=True)(teacher, x, stage)  # as train.py runs it
    assert t_compiled.keys() == t_out.keys()
    for k in t_out:
        for a, b in zip(*((v if isinstance(v, list) else [v]) for v in (t_compiled[k], t_out[k]))):
            assert rel(a, b) < (1e-5 if DEV == "cpu" else 1e-3)
    params = [p for _, p in distill.set_trainable(student, stage)]
    loss_model = distill.StageLoss(student, stage, backend="triton")
    out = []
    for fn in (loss_model, torch.compile(loss_model, fullgraph=True)):
        student.zero_grad()
        loss, _ = fn(x, x, t_out)
        loss.backward()
        out.append([loss.detach()] + [p.grad.clone() for p in params])
    tol = 1e-5 if DEV == "cpu" else 1e-3
    assert all(rel(a, b) < tol for a, b in zip(out[1], out[0]))
