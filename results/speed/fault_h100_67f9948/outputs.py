"""The delta rule's output and each input's gradient at a launch pair, against the defaults.

Run from the repository root on a CUDA machine:
    python results/speed/fault_h100_67f9948/outputs.py     # gdn, kda; T 64, 128; five pairs
    compute-sanitizer --tool memcheck python results/speed/fault_h100_67f9948/outputs.py --one=kda
Each line: operator, T, warps, value block, then each tensor's largest difference from the
defaults' (4 warps, block 64), relative to the defaults' largest entry. --one runs KDA at T 64
with 8 warps and a value block of 32 alone, forward then backward, for the sanitizer.
"""
import argparse
import os
import sys

import torch

root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path[:0] = [root, os.path.join(root, "scripts")]
import launch_sweep  # noqa: E402
import triton_ops  # noqa: E402

NAMES = ["o", "dq", "dk", "dv", "dbeta", "dg"]


def outputs(op, T, warps, bv):
    triton_ops._DELTA_WARPS, triton_ops._DELTA_BV = warps, bv
    inputs, fn = launch_sweep.case(op, 1, T, 1, 64, "cuda")
    ys = fn(*inputs)
    torch.cuda.synchronize()  # a forward kernel's fault is reported here, not in the backward
    grads = torch.autograd.grad(ys, inputs, [torch.ones_like(ys[0])])
    torch.cuda.synchronize()
    return [ys[0].float()] + [g.float() for g in grads]


parser = argparse.ArgumentParser()
parser.add_argument("--one", choices=["gdn", "kda"])
args = parser.parse_args()
if args.one:
    outputs(args.one, 64, 8, 32)
    print("ran")
    sys.exit()
for op in ("gdn", "kda"):
    for T in (64, 128):
        ref = None
        for warps, bv in ((4, 64), (8, 32), (8, 64), (4, 32), (2, 32)):
            got = outputs(op, T, warps, bv)
            ref = ref or got
            rel = [((a - b).abs().max() / b.abs().max()).item() for a, b in zip(got, ref)]
            diffs = " ".join(f"{n}={d:.1e}" for n, d in zip(NAMES, rel))
            print(op, T, warps, bv, diffs, flush=True)
