"""
Speed of the seven token mixers on a GPU: our Triton kernels (triton_ops.py) against our chunked
PyTorch forms (mixers.py), the published kernels of the same recurrences (--peers) and causal
FlashAttention (PyTorch SDPA).

Correctness comes first: every kernel is checked against the chunked PyTorch form in fp32
(outputs and every gradient) before anything is timed. The timed backward takes the gradients
the mixer's layer needs: RetNet's fixed decays get none, as in fla's chunk_retention. Times
are medians of triton.testing.do_bench in bf16; rows are appended to --out as they finish.
do_bench times a call as Python makes it, so a short kernel's column can be bound by the host
(the custom-operator dispatch and the launches); the "graphed" columns replay the same forward
and backward, ours, the peer's and FlashAttention's, from a CUDA graph
(triton.testing.do_bench_cudagraph), which leaves the device time alone. The kernels are
compared on those; the eager ratio shows the host's share.

    python bench.py                                  # all mixers, the three shapes below
    python bench.py --mixers=gla,kda --shapes=8x4096x16x64 --peers
    python bench.py --mixers=gla,kda --shapes=8x4096x16x64 --profile   # time per kernel

FLOP counts are those of the chunked algorithm (chunk C = 64, per token and head):
decayed additive 4*Dk*Dv + 2*C*(Dk+Dv), delta rule 6*Dk*Dv + 6*C*Dk + 4*C*Dv; forward plus
backward is counted as 3x forward, causal attention as 2*T*D forward and 3.5x for both.
Bytes are the floor: every input read once and every output written once.
The peer of each mixer, timed in the same run on inputs already in its own layout:
fla-org/flash-linear-attention 0.6.0's chunk_simple_gla (linear attention), chunk_retention
(RetNet), chunk_gla (GLA), chunk_delta_rule (DeltaNet), chunk_gated_delta_rule (Gated DeltaNet;
fla refuses its gated backward on Hopper with triton < 3.7.1, its issue #640, and the table says
so) and chunk_kda with safe_gate and lower_bound -5 (KDA, the same bounded gate as ours);
NX-AI/mlstm_kernels 2.0.6's chunkwise--triton_xl_chunk at its defaults (mLSTM). A peer whose
package is missing, or that raises, gets "-" and a line below the table saying why.
Timing: triton.testing.do_bench (medians after warm-up).
"""

import argparse
import os
import time

import torch
import torch.nn.functional as F
from triton.testing import do_bench, do_bench_cudagraph

import triton_ops
import mixers

SHAPES = [(8, 4096, 16, 64), (4, 8192, 16, 128), (1, 32768, 16, 64)]


def ours(name):
    """Our kernel for the mixer, with the gate floor its layer guarantees (GLA, KDA)."""
    gate_min = mixers.LAYERS[name].gate_min
    if mixers.FAMILY[name][0] == "additive":
        return lambda *x: triton_ops.chunk_decay_additive(*x, gate_min=gate_min)
    return lambda *x: triton_ops.chunk_delta_rule(*x, gate_min=gate_min)


def torch_form(name):
    return mixers.chunk_decay_additive if mixers.FAMILY[name][0] == "additive" else mixers.chunk_delta_rule


def peer(name):
    """(label, fn, inputs): the published kernel of the same recurrence, fn(*inputs(args)) -> its
    output, where inputs() puts our (q, k, v[, beta][, g]) into its layout before any timing; or
    (label, None, why) when its package does not import or the mixer has no peer here."""
    if name == "mlstm":
        label = "mlstm_kernels chunkwise--triton_xl_chunk"
        try:
            from mlstm_kernels.torch import get_mlstm_kernel
        except ImportError as e:
            return label, None, f"mlstm_kernels does not import ({e})"
        kernel = get_mlstm_kernel("chunkwise--triton_xl_chunk")

        def inputs(args):  # (B, NH, S, D) and the input and forget gates' pre-activations (B, NH, S)
            q, k, v = (x.transpose(1, 2).contiguous() for x in args[:3])
            return q, k, v, torch.randn(q.shape[:3], device=q.device), 3 + torch.randn(q.shape[:3], device=q.device)
        return label, lambda q, k, v, i, f: kernel(q, k, v, i, f), inputs
    fla = {"linear_attention": "chunk_simple_gla", "retnet": "chunk_retention", "gla": "chunk_gla",
           "deltanet": "chunk_delta_rule", "gated_deltanet": "chunk_gated_delta_rule", "kda": "chunk_kda"}.get(name)
    if fla is None:  # a mixer outside the study
        return f"no peer for {name}", None, "bench.py knows no published kernel of this recurrence"
    label = f"fla {fla}" + (" (safe_gate, lower_bound -5)" if name == "kda" else "")
    try:
        import fla.ops as ops
    except ImportError as e:
        return label, None, f"fla does not import ({e})"
    fn = getattr(ops, fla)
    return label, {
        "linear_attention": lambda q, k, v: fn(q, k, v)[0],
        "retnet": lambda q, k, v: fn(q, k, v)[0],  # fla's fixed decays are RetNet's gamma_h
        "gla": lambda q, k, v, g: fn(q, k, v, g=g)[0],
        "deltanet": lambda q, k, v, beta: fn(q, k, v, beta)[0],
        "gated_deltanet": lambda q, k, v, g, beta: fn(q, k, v, g, beta)[0],
        "kda": lambda q, k, v, g, beta: fn(q, k, v, g, beta, safe_gate=True, lower_bound=mixers.GATE_MIN)[0],
    }[name], {
        "linear_attention": lambda a: a, "retnet": lambda a: a[:3], "gla": lambda a: a, "deltanet": lambda a: a,
        "gated_deltanet": lambda a: (*a[:3], a[4], a[3]), "kda": lambda a: (*a[:3], a[4], a[3]),
    }[name]


def make_inputs(name, B, T, H, D, dtype=torch.bfloat16, seed=0):
    """Positional inputs (q, k, v[, beta][, g]) as the mixers produce them."""
    torch.manual_seed(seed)
    family, gate = mixers.FAMILY[name]
    q, k, v = (torch.randn(B, T, H, D, device="cuda", dtype=dtype) for _ in range(3))
    args = [q, k, v]
    if family == "delta":
        args[:2] = F.normalize(q, dim=-1), F.normalize(k, dim=-1)  # the delta rule needs |k| = 1
        args.append(torch.rand(B, T, H, device="cuda", dtype=dtype))  # beta in (0, 1)
    if gate == "head_const":  # RetNet: gamma_h = 1 - 2^(-5-h)
        args.append(torch.log(1 - 2.0 ** (-5 - torch.arange(H, device="cuda", dtype=torch.float32))))
    elif gate == "head":
        args.append(F.logsigmoid(torch.randn(B, T, H, device="cuda") + 4.0))
    elif gate == "channel" and family == "additive":  # GLA's, floored at GATE_MIN
        args.append((F.logsigmoid(torch.randn(B, T, H, D, device="cuda")) / 16).clamp(min=mixers.GATE_MIN))
    elif gate == "channel":  # KDA's bounded gate
        args.append(mixers.GATE_MIN * torch.sigmoid(torch.randn(B, T, H, D, device="cuda") - 3.0))
    return args


def call(fn, args):
    """Output of one of our functions: (q, k, v[, g]) additive, (q, k, v, beta[, g]) delta."""
    return fn(*args)[0]


def n_fixed(name):
    """How many of the mixer's last inputs it does not learn: RetNet's decays, one per head."""
    return 1 if mixers.FAMILY[name][1] == "head_const" else 0


def fwd_bwd(fn, args, do=None, fixed=0):
    """A closure that runs forward and backward (do: the output's gradient, random when None);
    its inputs' .grad are reset by do_bench. The last `fixed` inputs take no gradient."""
    n = len(args) - fixed
    leaves = [a.detach().clone().requires_grad_(a.is_floating_point() and i < n) for i, a in enumerate(args)]
    if do is None:
        with torch.no_grad():
            do = torch.randn_like(fn(leaves))
    return (lambda: fn(leaves).backward(do)), leaves


def relerr(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def check(name, shape=(2, 1000, 4, 64)):
    """Relative errors of our bf16 kernel against the fp32 chunked PyTorch form: o, then grads."""
    args = make_inputs(name, *shape)
    do = torch.randn_like(args[2])
    results = []
    for fn, dtype in [(ours(name), torch.bfloat16), (torch_form(name), torch.float32)]:
        # q, k, v, beta in the tested dtype; log decays stay fp32 as the mixers make them
        leaves = [(a.to(dtype) if a.dtype == torch.bfloat16 else a).detach().requires_grad_(True) for a in args]
        o = call(fn, leaves)
        o.backward(do.to(o.dtype))
        results.append([o] + [x.grad for x in leaves])
    return [relerr(a, b) for a, b in zip(*results)]


def kernel_times(run, steps=5):
    """{kernel name: (ms of device time a call of run, launches a call)} from torch.profiler, after
    3 calls to compile and warm up. Kernel events only: the ops that launch them carry the same
    time again."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            run()
        torch.cuda.synchronize()
    return {e.key: (e.self_device_time_total / steps / 1000, e.count // steps) for e in prof.key_averages()
            if e.device_type == torch.autograd.DeviceType.CUDA}


def profile_kernels(name, shape, emit, steps=5):
    """Device time of each kernel in one forward+backward of our kernels, most expensive first."""
    args = make_inputs(name, *shape)
    fwd_bwd_, leaves = fwd_bwd(lambda x: call(ours(name), x), args, torch.randn_like(args[2]), n_fixed(name))

    def run():  # the gradients reset first, as do_bench does: no accumulating adds in the profile
        for x in leaves:
            x.grad = None
        fwd_bwd_()

    times = kernel_times(run, steps)
    total = sum(ms for ms, _ in times.values())
    emit(f"\n{name} at {shape}: {total:.3f} ms of kernels per forward+backward")
    for key, (ms, n) in sorted(times.items(), key=lambda kv: -kv[1][0]):
        emit(f"  {ms:7.3f} ms  {100 * ms / total:4.1f}%  x{n}  {key[:70]}")


def sdpa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def ceilings():
    """Copy bandwidth (GB/s, bytes read + written) and bf16 matmul rate (TFLOP/s) of this card."""
    x = torch.empty(2 ** 30, device="cuda", dtype=torch.uint8)
    y = torch.empty_like(x)
    gbs = 2 * x.numel() / do_bench(lambda: y.copy_(x), return_mode="median") / 1e6
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    tfs = 2 * 8192 ** 3 / do_bench(lambda: a @ a, return_mode="median") / 1e9
    return gbs, tfs


def flops_fwd(family, B, T, H, D, C=64):
    per_token = 4 * D * D + 4 * C * D if family == "additive" else 6 * D * D + 10 * C * D
    return B * T * H * per_token


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mixers", default=",".join(mixers.MIXERS), help="comma-separated names from mixers.MIXERS")
    ap.add_argument("--shapes", default=",".join("x".join(map(str, s)) for s in SHAPES), help="BxTxHxD,...")
    ap.add_argument("--peers", action="store_true", help="also time fla's and mlstm_kernels' kernels "
                    "(fla autotunes for minutes per shape)")
    ap.add_argument("--profile", action="store_true", help="time each kernel of ours instead of the table")
    ap.add_argument("--out", default="out/bench.md", help="markdown table, appended row by row")
    a = ap.parse_args()
    names = a.mixers.split(",")
    bad = [n for n in names if n not in mixers.MIXERS]
    if bad:
        ap.error(f"unknown mixer {bad[0]!r}; valid: {', '.join(mixers.MIXERS)}")
    try:
        shapes = [tuple(int(x) for x in s.split("x")) for s in a.shapes.split(",")]
    except ValueError:
        shapes = []
    if not shapes or not all(len(s) == 4 and min(s) > 0 for s in shapes):
        ap.error(f"--shapes={a.shapes!r}: expected BxTxHxD,... such as 8x4096x16x64")
    if not torch.cuda.is_available():
        raise SystemExit("bench.py: needs a CUDA GPU (it times the compiled kernels; the CPU tests check them)")
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    out = open(a.out, "a")

    def emit(line):
        print(line, flush=True)
        out.write(line + "\n")
        out.flush()

    if a.profile:
        for shape in shapes:
            for name in names:
                profile_kernels(name, shape, emit)
        return
    gbs, tfs = ceilings()
    emit(f"\n{torch.cuda.get_device_name()}, torch {torch.__version__}, {time.strftime('%Y-%m-%d')}: "
         f"copy {gbs:.0f} GB/s, bf16 matmul {tfs:.0f} TFLOP/s\n")
    emit("correctness, bf16 kernel vs fp32 chunked PyTorch form at (2, 1000, 4, 64), relative error:")
    for name in names:
        errs = check(name)
        bad = errs[0] > 0.005 or max(errs[1:4]) > 0.008 or max(errs[4:] + [0]) > 0.02
        emit(f"  {name:17s} o {errs[0]:.1e}  grads " + " ".join(f"{e:.1e}" for e in errs[1:])
             + ("  FAIL" if bad else ""))
    cols = ["mixer", "B,T,H,D", "ours fwd", "ours fwd+bwd", "peer fwd+bwd", "ours/peer", "ours graphed", "peer graphed",
            "ours/peer graphed", "SDPA graphed", "SDPA/ours graphed", "torch fwd+bwd", "torch/ours",
            "TFLOP/s graphed (% peak)", "GB/s graphed (% copy)"]
    emit("\n| " + " | ".join(cols) + " |")
    emit("|" + "---|" * len(cols))
    notes = []
    for shape in shapes:
        B, T, H, D = shape
        qkv = [torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
        run, leaves = fwd_bwd(lambda x: sdpa(*x), qkv, torch.randn_like(qkv[0]))
        t_sdpa = do_bench_cudagraph(run, grad_to_none=leaves, return_mode="median")
        del qkv, leaves, run
        for name in names:
            family, _ = mixers.FAMILY[name]
            args = make_inputs(name, *shape)
            do = torch.randn_like(args[2])
            ms = {}
            with torch.no_grad():
                ms["fwd"] = do_bench(lambda args=args: call(ours(name), args), return_mode="median")
            for key, fn in [("ours", ours(name)), ("torch", torch_form(name))]:
                run, leaves = fwd_bwd(lambda x, fn=fn: call(fn, x), args, do, n_fixed(name))
                try:
                    ms[key] = do_bench(run, grad_to_none=leaves, return_mode="median")
                    if key == "ours":
                        ms["graph"] = do_bench_cudagraph(run, grad_to_none=leaves, return_mode="median")
                except torch.OutOfMemoryError:
                    torch.cuda.empty_cache()
            if a.peers:
                label, fn, inputs = peer(name)
                try:
                    if fn is None:
                        raise RuntimeError(inputs)
                    run, leaves = fwd_bwd(lambda x, fn=fn: fn(*x), list(inputs(args)))
                    ms["peer"] = do_bench(run, grad_to_none=leaves, return_mode="median")  # autotunes first
                    ms["peer graph"] = do_bench_cudagraph(run, grad_to_none=leaves, return_mode="median")
                except Exception as e:  # noqa: BLE001 - any refusal of the peer is reported, not fatal
                    torch.cuda.empty_cache()
                    what = "no graphed peer time" if "peer" in ms else "no peer time"
                    notes.append(f"{name} at {B},{T},{H},{D}: {what}, {label}: {type(e).__name__}: "
                                 f"{str(e).strip().splitlines()[0][:200] if str(e).strip() else ''}")
            nbytes = 2 * sum(x.numel() * x.element_size() for x in args) + 2 * do.numel() * do.element_size()
            nbytes += sum(x.numel() * x.element_size() for x in args)  # the gradients
            dev = ms.get("graph", ms.get("ours"))  # device time where the graph ran
            tf = 3 * flops_fwd(family, *shape) / dev / 1e9
            gb = nbytes / dev / 1e6
            fmt = lambda k: f"{ms[k]:.3f}" if k in ms else "-"  # noqa: E731
            ratio = lambda x, y: f"{ms[x] / ms[y]:.2f}" if x in ms and y in ms else "-"  # noqa: E731
            emit(f"| {name} | {B},{T},{H},{D} | {fmt('fwd')} | {fmt('ours')} | {fmt('peer')} | {ratio('ours', 'peer')} "
                 f"| {fmt('graph')} | {fmt('peer graph')} | {ratio('graph', 'peer graph')} | {t_sdpa:.3f} "
                 f"| {t_sdpa / dev:.2f} | {fmt('torch')} | {ratio('torch', 'ours')} "
                 f"| {tf:.0f} ({100 * tf / tfs:.0f}%) | {gb:.0f} ({100 * gb / gbs:.0f}%) |")
            del args, do
            torch.cuda.empty_cache()
    for line in [""] + notes if notes else []:
        emit(line)


if __name__ == "__main__":
    main()
