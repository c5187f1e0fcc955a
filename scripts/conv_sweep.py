"""
The short conv's launch shape, swept on a GPU: rows a program and warps, forward and backward.

triton_ops.py launches the short conv's kernels with _CONV_BT time rows a program and
_CONV_WARPS warps (section 5). This script times the forward and the backward of one Gated
DeltaNet layer's conv (q, k and v of H heads of D channels cut from the projection's rows, padded
as triton_ops.in_projection pads them, q and k L2-normalized, 4 taps, bf16) at each pair, checks
each pair's outputs against the defaults', and prints a line a pair as it finishes:

    python scripts/conv_sweep.py                      # stage 3's shape: 64 x 512, 9 heads of 64
    python scripts/conv_sweep.py --B=8 --T=4096 --H=16 --rows=32,64 --warps=2,4 --out=sweep.txt

Times are triton.testing.do_bench's (median of repeated launches, synchronized). Needs a CUDA
GPU; under TRITON_INTERPRET=1 it runs on the CPU untimed, which checks the outputs only.
"""

import argparse
import itertools
import os
import sys

import torch
import triton.testing

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import triton_ops  # noqa: E402


def ints(text):
    """'32,64' -> [32, 64], each a power of two >= 1 (Triton's block shapes are)."""
    vals = [int(v) for v in text.split(",") if v]
    if not vals or any(v < 1 or v & (v - 1) for v in vals):
        raise argparse.ArgumentTypeError(f"expected powers of two separated by commas, got {text!r}")
    return vals


def sweep(B, T, H, D, rows, warps, timed=True, seed=0):
    """[(rows, warps, forward us, backward us, max difference from the defaults)], the defaults'
    pair first. The difference is the largest over the forward's outputs and dx (absolute, bf16)
    and dw (relative to its largest entry); the times are 0.0 when not timed."""
    dev = "cuda" if timed else "cpu"
    g = torch.Generator(device="cpu").manual_seed(seed)
    DP = H * D
    width = 4 * DP + 2 * H  # q, k, v, the output gate, beta and the decay's input
    width += -width % triton_ops.ROW_ALIGN
    x = torch.randn(B, T, width, generator=g).to(dev, torch.bfloat16)[..., : 3 * DP]
    w = (torch.randn(3 * DP, 4, generator=g) * 0.5).to(dev)
    dys = [torch.randn(B, T, DP, generator=g).to(dev, torch.bfloat16) for _ in range(3)]
    fwd = lambda: triton_ops._short_conv_fwd(x, w, 3, 2, D)  # noqa: E731
    bwd = lambda: triton_ops._short_conv_bwd(dys, x, w, 2, D)  # noqa: E731
    default = (triton_ops._CONV_BT, triton_ops._CONV_WARPS)
    pairs = [default] + [p for p in itertools.product(rows, warps) if p != default]
    ref = None
    try:
        for bt, nw in pairs:
            triton_ops._CONV_BT, triton_ops._CONV_WARPS = bt, nw
            got = [y.float() for y in fwd()] + [t.float() for t in bwd()]
            ref = ref or got
            diff = max((a - b).abs().max().item() for a, b in zip(got[:-1], ref[:-1]))
            diff = max(diff, ((got[-1] - ref[-1]).abs().max() / ref[-1].abs().max()).item())
            tf = triton.testing.do_bench(fwd, warmup=25, rep=200) * 1000 if timed else 0.0
            tb = triton.testing.do_bench(bwd, warmup=25, rep=200) * 1000 if timed else 0.0
            yield bt, nw, tf, tb, diff
    finally:
        triton_ops._CONV_BT, triton_ops._CONV_WARPS = default


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for name, default in (("B", 64), ("T", 512), ("H", 9), ("D", 64)):
        ap.add_argument(f"--{name}", type=int, default=default)
    ap.add_argument("--rows", type=ints, default=[32, 64, 128], help="time rows a program")
    ap.add_argument("--warps", type=ints, default=[2, 4, 8], help="warps a program")
    ap.add_argument("--out", default="", help="also write the lines to this file")
    args = ap.parse_args()
    if min(args.B, args.T, args.H, args.D) < 1:
        ap.error("--B, --T, --H and --D: expected integers >= 1")
    interpret = os.environ.get("TRITON_INTERPRET") == "1"
    if not interpret and not torch.cuda.is_available():
        sys.exit("conv_sweep.py: needs a CUDA GPU (or TRITON_INTERPRET=1 to check the outputs on the CPU, untimed)")
    head = (f"{torch.cuda.get_device_name() if not interpret else 'cpu, untimed'}: short conv of "
            f"{args.B} x {args.T} x 3 x {args.H} x {args.D}, bf16")
    lines = [head]
    print(head, flush=True)
    default = (triton_ops._CONV_BT, triton_ops._CONV_WARPS)
    for bt, nw, tf, tb, diff in sweep(args.B, args.T, args.H, args.D, args.rows, args.warps, timed=not interpret):
        times = "untimed" if interpret else f"forward {tf:7.1f} us  backward {tb:7.1f} us"
        line = f"rows {bt:3d} warps {nw}: {times}  max diff {diff:.1e}" + ("  (the defaults)" if (bt, nw) == default else "")
        lines.append(line)
        print(line, flush=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
