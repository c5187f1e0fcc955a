"""
triton_ops.py's launch constants, swept on a GPU: each combination timed and checked.

Each kernel launch in triton_ops.py takes its block shape and warps from a module constant named
after its section (_CONV_BT, _CONV_WARPS, _DELTA_WARPS, ...), read at the call. This script sets
the constants to every combination of the values given, runs one operator at one layer's shape
forward and forward + backward (autograd, bf16, as a training step runs it), times both, and
checks the output and the gradients against the defaults'. One line a combination, the
defaults' first:

    python scripts/launch_sweep.py                                  # the short conv at stage 3's shape
    python scripts/launch_sweep.py --op=gdn --set=_DELTA_WARPS=4,8  # one constant, these values
    python scripts/launch_sweep.py --op=kda --B=8 --T=4096 --H=16 --out=sweep.txt
    python scripts/launch_sweep.py --op=gdn --kernels      # and each kernel's time (torch.profiler)
    python scripts/launch_sweep.py --op=loss --V=49152     # stage 3's fused loss, 4,096 rows of logits

The operators, each as a layer of SmolLM2-135M's students calls it (H heads of D channels):
  conv  the short conv of q, k and v cut from the projection's padded rows, q and k L2-normalized
  gdn   chunk_delta_rule with a decay per head (Gated DeltaNet)
  kda   chunk_delta_rule with a decay per key channel, bounded (KDA)
  gla   chunk_decay_additive with a decay per key channel, bounded (GLA)
  head  chunk_decay_additive with a decay per head and token, values D + 1 wide (mLSTM, whose
        last value channel is the normalizer; RetNet's constant decay and linear attention's
        none run the same kernel functions with another gate)
  norm  rms_norm_gate: the output norm times the SiLU gate, the gate a view of the projection
        (RetNet, GLA, Gated DeltaNet)
  loss  distill_loss_grad: stage 3's CE + KL with its gradient, computed in one pass outside
        autograd as head_loss calls it, on min(B * T, 4096) rows of V logits (the rows head_loss
        passes at a time); its two times are the same call
Times are triton.testing.do_bench's medians, from the host: one eager call can issue its
launches more slowly than the device runs them, so that a faster kernel leaves its times
unchanged (on one H100, the delta rule's forward + backward at stage 3's shape took 1.53 ms with
kernels of 1.24 ms and of 0.97 alike). With --kernels each kernel's device time follows, and
their sum, what a compiled step bound by the device would see. Needs a CUDA GPU; under
TRITON_INTERPRET=1 it runs on the CPU untimed and in fp32, which checks the outputs only: the
interpreter ignores warps, so there a warps constant cannot fail, and a block constant can.
"""

import argparse
import itertools
import math
import os
import sys

import torch
import torch.nn.functional as F
import triton.testing

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import mixers  # noqa: E402
import triton_ops  # noqa: E402
from bench import kernel_times  # noqa: E402

SWEEPS = {  # each operator's constants swept when --set is not given
    "conv": {"_CONV_BT": [32, 64, 128], "_CONV_WARPS": [2, 4, 8]},
    "gdn": {"_DELTA_WARPS": [2, 4, 8], "_DELTA_WIDE_WARPS": [4, 8], "_DELTA_BV": [32, 64]},
    "kda": {"_DELTA_CHANNEL_WARPS": [1, 2, 4], "_DELTA_WARPS": [2, 4], "_DELTA_WIDE_WARPS": [4, 8]},
    "gla": {"_ADD_WARPS": [2, 4], "_ADD_CHANNEL_WARPS": [1, 2, 4], "_ADD_STATE_BV": [32, 64]},
    "head": {"_ADD_WARPS": [2, 4, 8], "_ADD_STATE_BV": [32, 64]},
    "norm": {"_NORM_BLOCK": [1024, 2048, 4096, 8192], "_NORM_WARPS": [1, 2, 4, 8]},
    "loss": {"_LOSS_BV": [1024, 2048, 4096, 8192], "_LOSS_WARPS": [4, 8, 16]},
}


def case(op, B, T, H, D, device, dtype=torch.bfloat16, seed=0, V=49152):
    """(inputs, fn(*inputs) -> [outputs]): one layer's call of the operator, its inputs as the
    layer passes them (q, k and v views of the projection for the conv, the gate one for the
    norm; the decays in fp32, as the layers' gate functions give them). The inputs take gradients,
    but the loss's: its gradient is one of its outputs."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    rand = lambda *shape: torch.randn(*shape, generator=g)  # noqa: E731
    leaf = lambda t, dt=dtype: t.to(device, dt).requires_grad_()  # noqa: E731
    width = 4 * H * D + 2 * H  # the projection's rows: q, k, v, the output gate, beta and the decay's input
    width += -width % triton_ops.ROW_ALIGN
    if op == "loss":  # student and teacher logits of one slice of rows, the targets
        N = min(B * T, triton_ops.HEAD_ROWS)
        z, t = ((rand(N, V) * 4).to(device, dtype) for _ in range(2))
        y = torch.randint(V, (N,), generator=g).to(device)
        inv_n = torch.tensor(1.0 / (B * T), device=device)  # a slice of the batch's B * T rows
        return [z], lambda z: list(triton_ops.distill_loss_grad(z, t, y, inv_n=inv_n))
    if op == "norm":  # o [B, T, H, D] from the recurrence, the norm's weight [D], the gate from the projection
        o, proj, w = leaf(rand(B, T, H, D)), leaf(rand(B, T, width)), leaf(1 + 0.1 * rand(D), torch.float32)
        return [o, w, proj], lambda o, w, proj: [
            triton_ops.rms_norm_gate(o, w, proj[..., 3 * H * D: 4 * H * D].unflatten(-1, (H, D)), "silu")]
    if op == "conv":
        proj, w = leaf(rand(B, T, width)), leaf(rand(3 * H * D, 4) * 0.5, torch.float32)
        return [proj, w], lambda proj, w: list(triton_ops.short_conv(proj[..., : 3 * H * D], w, 3, 2, D))
    q, k, v = (leaf(F.normalize(rand(B, T, H, D), dim=-1)) for _ in range(3))
    decay = lambda *shape: leaf(F.logsigmoid(rand(*shape) + 3).clamp(min=mixers.GATE_MIN), torch.float32)  # noqa: E731
    if op == "head":  # mLSTM's values: v and a column of ones, the normalizer's
        v = leaf(torch.cat([F.normalize(rand(B, T, H, D), dim=-1), torch.ones(B, T, H, 1)], -1))
    if op in ("gla", "head"):
        return [q, k, v, decay(B, T, H, *((D,) if op == "gla" else ()))], lambda q, k, v, gk: [
            triton_ops.chunk_decay_additive(q, k, v, gk, gate_min=mixers.GATE_MIN if op == "gla" else None)[0]]
    beta = leaf(torch.sigmoid(rand(B, T, H)))
    bound = mixers.GATE_MIN if op == "kda" else None
    return [q, k, v, beta, decay(B, T, H, *((D,) if op == "kda" else ()))], lambda q, k, v, beta, gk: [
        triton_ops.chunk_delta_rule(q, k, v, beta, gk, gate_min=bound)[0]]


def sweep(op, B, T, H, D, values, timed=True, kernels=False, V=49152):
    """Yields (combination {name: value}, forward ms, forward + backward ms, max difference from
    the defaults, {kernel: ms} with kernels), the defaults first. The difference is the largest
    over the output and each input's gradient, relative to that tensor's largest entry. Untimed:
    times None, no kernels, on the CPU in fp32 (Triton's interpreter); timed: on the GPU in bf16.
    A combination that does not run, or gives a value that is not finite, has "failed: " and its
    error's first line in place of the times; after one that leaves the GPU unusable, the rest
    have "not run: " and why."""
    device, dtype = ("cuda", torch.bfloat16) if timed else ("cpu", torch.float32)  # the interpreter's bf16 is not a GPU's
    inputs, fn = case(op, B, T, H, D, device, dtype, V=V)
    gen = torch.Generator().manual_seed(1)
    dys = [torch.randn(y.shape, generator=gen).to(y.device, y.dtype) for y in fn(*inputs)]
    names = list(values)
    default = tuple(getattr(triton_ops, n) for n in names)
    combos = [default] + [c for c in itertools.product(*values.values()) if c != default]
    grads = inputs[0].requires_grad  # the loss's gradient is an output: no backward to time

    def run():
        ys = fn(*inputs)
        return [*ys, *torch.autograd.grad(ys, inputs, dys)] if grads else ys

    def bench(f):
        return triton.testing.do_bench(f, warmup=25, rep=200, return_mode="median")

    def first_line(e):
        return (str(e).strip().splitlines() or [type(e).__name__])[0]

    ref = None
    try:
        for i, combo in enumerate(combos):
            for n, v in zip(names, combo):
                setattr(triton_ops, n, v)
            try:
                got = [t.float() for t in run()]
                if not all(t.isfinite().all() for t in got):
                    raise ArithmeticError("an output or a gradient is not finite")
                if ref is None and combo != default:
                    raise RuntimeError("the defaults did not run, so there is nothing to check against")
                ref = ref or got
                diff = max(((a - b).abs().max() / b.abs().max().clamp(min=1e-30)).item() for a, b in zip(got, ref))
                fwd = bench(lambda: fn(*inputs)) if timed else None
                times = (fwd, bench(run) if timed and grads else fwd)
            except Exception as e:  # out of resources, or a shape these kernels refuse
                yield dict(zip(names, combo)), f"failed: {first_line(e)[:120]}", None, None, {}
                if timed and not device_usable():  # a kernel faulted: every later call would fail too
                    at = " ".join(f"{n}={v}" for n, v in zip(names, combo))
                    for rest in combos[i + 1:]:
                        yield dict(zip(names, rest)), f"not run: the GPU's context was lost at {at}", None, None, {}
                    return
                continue
            try:
                per_kernel = {k: ms for k, (ms, _) in kernel_times(run).items()} if kernels and timed else {}
            except Exception as e:  # the profiler's failure costs the kernels' lines, not the times
                per_kernel = {f"(no kernel times: {first_line(e)[:80]})": float("nan")}
            yield dict(zip(names, combo)), *times, diff, per_kernel
    finally:
        for n, v in zip(names, default):
            setattr(triton_ops, n, v)


def device_usable():
    """False once a kernel has faulted (an illegal address, say): CUDA's context then fails every
    later call, so the combinations after it would report that fault, not their own."""
    try:
        torch.cuda.synchronize()
        return torch.ones(1, device="cuda").sum().item() == 1
    except Exception:
        return False


def setting(text):
    """'_CONV_WARPS=2,4' -> ('_CONV_WARPS', [2, 4]): an integer constant of triton_ops.py, values >= 1."""
    name, _, vals = text.partition("=")
    if not isinstance(getattr(triton_ops, name, None), int) or not name.startswith("_") or name.startswith("__"):
        raise argparse.ArgumentTypeError(f"{name!r} is not an integer launch constant of triton_ops.py")
    try:
        out = [int(v) for v in vals.split(",")]
    except ValueError:
        out = []
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME=integers >= 1 separated by commas")
    return name, out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--op", default="conv", choices=sorted(SWEEPS))
    for name, default in (("B", 64), ("T", 512), ("H", 9), ("D", 64)):
        ap.add_argument(f"--{name}", type=int, default=default, help=f"default {default}: stage 3's shape")
    ap.add_argument("--V", type=int, default=49152, help="--op=loss: the vocabulary (default SmolLM2's 49,152)")
    ap.add_argument("--set", type=setting, action="append", default=[],
                    help="NAME=v1,v2,...: a constant and its values (repeat for more; default: the operator's)")
    ap.add_argument("--kernels", action="store_true", help="also each kernel's device time in a forward + backward")
    ap.add_argument("--out", default="", help="also write the lines to this file")
    args = ap.parse_args()
    if min(args.B, args.T, args.H, args.D, args.V) < 1:
        ap.error("--B, --T, --H, --D and --V: expected integers >= 1")
    interpret = os.environ.get("TRITON_INTERPRET") == "1"
    if not interpret and not torch.cuda.is_available():
        sys.exit("launch_sweep.py: needs a CUDA GPU (or TRITON_INTERPRET=1 to check the outputs on the CPU, untimed)")
    values = dict(args.set) or SWEEPS[args.op]
    lines = [f"{'cpu, untimed, fp32' if interpret else torch.cuda.get_device_name() + ', bf16'}: {args.op} at B {args.B}, "
             f"T {args.T}, H {args.H}, D {args.D}{f', V {args.V}' if args.op == 'loss' else ''}; times in ms, "
             "forward and forward + backward"]
    print(lines[0], flush=True)
    combos = sweep(args.op, args.B, args.T, args.H, args.D, values, not interpret, args.kernels, args.V)
    for i, (combo, fwd, both, diff, per_kernel) in enumerate(combos):
        what = " ".join(f"{n}={v}" for n, v in combo.items())
        if isinstance(fwd, str):  # what became of a combination that did not run
            lines.append(f"{what}: {fwd}")
        else:
            times = "untimed" if fwd is None else f"{fwd:.3f} {both:.3f}"
            lines.append(f"{what}: {times}  max diff {diff:.1e}" + ("  (the defaults)" if i == 0 else ""))
        block = [f"    {ms:7.3f}  {name[:80]}" for name, ms in sorted(per_kernel.items(), key=lambda kv: -kv[1])]
        if per_kernel and all(math.isfinite(ms) for ms in per_kernel.values()):
            block.append(f"    {sum(per_kernel.values()):7.3f}  the kernels together: the device's time of a forward + backward")
        lines += block
        print("\n".join(lines[-1 - len(block):]), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
