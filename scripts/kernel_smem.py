"""
Shared memory of every kernel launch of triton_ops.py, compiled for sm_90 (H100, H200) without a GPU.

A GPU refuses a launch that needs more than 227 KB of shared memory per block (Triton raises
OutOfResources), and Triton's CPU interpreter never notices. This script calls the public
functions of triton_ops.py under the interpreter at small shapes, records every launch (kernel,
argument dtypes, constexprs, warps, stages) without running it, compiles each distinct one
offline with Triton's own compiler for sm_90 in subprocesses without the interpreter, and reads
the shared memory the compiled kernel asks for, and how its global loads came out: vector loads
(8 or 16 bytes), or loads of 1 or 2 bytes, the sign of a stride or an offset the compiler could
not prove aligned; and, from Triton's own ptxas, the registers a thread uses and the bytes it
spills (a kernel at 255 registers runs two programs of 4 warps to a multiprocessor at most, and
spills go to memory).

    python scripts/kernel_smem.py                            # both families, fp32 and bf16, Dk 64 and 128
    python scripts/kernel_smem.py --dtypes=fp32 --dims=128 --families=delta
    python scripts/kernel_smem.py --families=glue            # section 5 (the short conv, norms, loss)
    python scripts/kernel_smem.py --families=delta --kernels=_delta_kkt_kernel   # one kernel's launches

Prints one line per compiled launch and exits with status 1 when one does not fit. Big kernels
take 5 to 15 s each to compile on a CPU. tests/test_kernels_compile.py checks a subset.
"""

import argparse
import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SM90_SHARED = 232448  # bytes of shared memory one block may use on sm_90 (227 KB)


def launches(dtypes=("fp32", "bf16"), dims=(64, 128), families=("additive", "delta", "glue"), kernels=None,
             execute=False):
    """Call the public functions under Triton's interpreter; the distinct launches they make, as
    [kernel name, {argument: ["ptr", "*<dtype>"] or ["val", value]}, {num_warps, num_stages}].
    kernels: keep only launches of these kernel names. execute: also run each kernel; without it
    a launch is recorded and skipped (what compiles depends on its arguments' types and values,
    not on what the tensors hold, which then stay as allocated), in seconds instead of minutes.
    Needs TRITON_INTERPRET=1 before triton is imported."""
    import torch
    import triton.runtime.interpreter as interpreter

    sys.path.insert(0, ROOT)
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    import triton_ops
    from gradients import run_and_grad

    names = {torch.float32: "fp32", torch.bfloat16: "bf16"}
    ptr_types = {**names, torch.float64: "fp64", torch.int64: "i64", torch.int32: "i32"}
    found, run = {}, interpreter.InterpretedFunction.run

    def spy(self, *args, grid, warmup, **kwargs):
        values = dict(zip(self.arg_names, args), **kwargs)
        opts = {"num_warps": values.pop("num_warps", 4), "num_stages": values.pop("num_stages", 3)}
        for n, v in values.items():
            if torch.is_tensor(v) and v.dtype not in ptr_types:
                raise TypeError(f"{self.fn.__name__}: argument {n} is a {v.dtype} tensor, not one of {list(ptr_types)}")
        enc = {n: ["ptr", "*" + ptr_types[v.dtype]] if torch.is_tensor(v) else ["val", v]
               for n, v in values.items()}
        if kernels is None or self.fn.__name__ in kernels:
            launch = [self.fn.__name__, enc, opts]
            found[json.dumps(launch, sort_keys=True)] = launch
        if execute:
            return run(self, *args, grid=grid, warmup=warmup, **kwargs)

    B, T, H = 1, 70, 2  # two chunks, the second one partial
    gen = torch.Generator().manual_seed(0)
    rnd = lambda *s: 0.1 * torch.randn(*s, generator=gen)  # noqa: E731
    gates = {"none": lambda K: None, "const": lambda K: torch.full((H,), -0.1),
             "head": lambda K: -0.1 * torch.rand(B, T, H), "channel": lambda K: -0.1 * torch.rand(B, T, H, K)}
    interpreter.InterpretedFunction.run = spy
    try:
        for dtype in [d for d, n in names.items() if n in dtypes]:
            for D in dims:
                q, k, v = (rnd(B, T, H, D).to(dtype) for _ in range(3))
                k = torch.nn.functional.normalize(k.float(), dim=-1).to(dtype)
                beta, h0, do, dht = torch.rand(B, T, H), rnd(B, H, D, D), rnd(B, T, H, D), rnd(B, H, D, D)
                for gate, make in gates.items():
                    g = make(D)
                    g1 = g if g is None or gate == "const" else g[:, :1]
                    with torch.no_grad():  # the fused decoding step (inference only)
                        if "additive" in families:
                            triton_ops.recurrent_step_decay_additive(q[:, :1], k[:, :1], v[:, :1], g1, h0)
                        if "delta" in families and gate != "const":
                            triton_ops.recurrent_step_delta_rule(q[:, :1], k[:, :1], v[:, :1], beta[:, :1], g1, h0)
                    if "additive" in families:  # per-channel gates also with a bound (BOUNDED=1)
                        for gate_min in [None] + ([-5.0] if gate == "channel" else []):
                            run_and_grad(triton_ops.chunk_decay_additive, q, k, v, g, h0, do=do, dht=dht,
                                         gate_min=gate_min)
                    if "delta" in families and gate != "const":  # the delta rule's gate is per step
                        for gate_min in [None] + ([-5.0] if gate == "channel" else []):
                            run_and_grad(triton_ops.chunk_delta_rule, q, k, v, beta, g, h0, do=do, dht=dht,
                                         gate_min=gate_min)
                if "glue" in families:  # section 5, at this head size
                    glue(triton_ops, rnd, dtype, B, T, H, D)
    finally:
        interpreter.InterpretedFunction.run = run
    return list(found.values())


def glue(triton_ops, rnd, dtype, B, T, H, D):
    """Section 5's kernels, forward and backward: the short conv plain and cutting q, k, v with
    L2 norms, the output norm with each gate, the L2 norm, the log decay (per head and per
    channel) and the distillation loss."""
    import torch

    def backward(out):
        outs = out if isinstance(out, (tuple, list)) else (out,)
        outs = [o for o in outs if o.requires_grad]
        torch.autograd.backward(outs, [torch.ones_like(o) for o in outs])

    leaf = lambda *s: rnd(*s).to(dtype).requires_grad_()  # noqa: E731
    w = rnd(3 * H * D, 4).requires_grad_()
    backward(triton_ops.short_conv(leaf(B, T, 3 * H * D), w))
    backward(triton_ops.short_conv(leaf(B, T, 3 * H * D + 8)[..., : 3 * H * D], w, parts=3, l2_parts=2, head_dim=D))
    for act in (None, "silu", "sigmoid"):
        backward(triton_ops.rms_norm_gate(leaf(B, T, H, D), rnd(D).requires_grad_(), None if act is None else
                                       leaf(B, T, H, D), act))
    backward(triton_ops.l2_normalize(leaf(B, T, H, D)))
    backward(triton_ops.softplus_decay(leaf(B, T, H), rnd(H).requires_grad_(), rnd(H).requires_grad_()))
    backward(triton_ops.softplus_decay(leaf(B, T, H, D), rnd(H).requires_grad_(), rnd(H * D).requires_grad_()))
    backward(triton_ops.sigmoid_decay(leaf(B, T, H, D), rnd(H).requires_grad_(), rnd(H * D).requires_grad_(), -5.0))
    y = torch.randint(0, 100, (B * T,))
    triton_ops.distill_loss_grad(leaf(B * T, 100), rnd(B * T, 100).to(dtype), y)


def compile_all(found, jobs=2):
    """[kernel name, constexprs, options, shared bytes] per distinct compiled launch, through
    `jobs` subprocesses of this script (--compile) that import triton without the interpreter."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--compile"], cwd=ROOT, env=env,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(jobs)]
    outs = [p.communicate(json.dumps(found[i::jobs])) for i, p in enumerate(procs)]
    for p, (_, err) in zip(procs, outs):
        if p.returncode:
            raise RuntimeError(f"offline compile failed:\n{err[-3000:]}")
    return [json.loads(line) for out, _ in outs for line in out.splitlines()]


def registers(ptx):
    """{"regs", "spills"}: registers a thread and bytes spilled to local memory, from Triton's own
    ptxas run verbosely on the kernel's PTX (-1 each where it prints neither)."""
    import tempfile

    from triton.backends.nvidia.compiler import get_ptxas

    ptxas = get_ptxas(90).path  # the one Triton itself assembles sm_90 kernels with
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "k.ptx")
        with open(path, "w") as f:
            f.write(ptx)
        run = subprocess.run([ptxas, "--gpu-name=sm_90a", "-v", path, "-o", os.path.join(d, "k.cubin")],
                             capture_output=True, text=True)
        out = run.stdout + run.stderr
    regs, spill = re.search(r"Used (\d+) registers", out), re.search(r"(\d+) bytes spill stores", out)
    return {"regs": int(regs[1]) if regs else -1, "spills": int(spill[1]) if spill else -1}


def compile_stdin():
    """--compile: launches as JSON on stdin -> one JSON line per distinct compiled launch."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sys.path.insert(0, ROOT)
    import triton_ops

    done = set()
    for name, args, opts in json.load(sys.stdin):
        fn = getattr(triton_ops, name)
        constexpr = {fn.arg_names[i] for i in fn.constexprs}
        sig, consts = {}, {}
        for n in fn.arg_names:  # runtime scalars matter to the compiler by type alone
            kind, v = args[n]
            if n in constexpr:
                sig[n], consts[n] = "constexpr", v
            else:
                sig[n] = v if kind == "ptr" else ("fp32" if isinstance(v, float) else "i32")
        # what Triton's JIT assumes of a launch: pointers 16-byte aligned, integers that divide by
        # 16 known to (it proves wide loads from these); launches that differ there compile apart
        attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names) if n not in constexpr and
                 (args[n][0] == "ptr" or (isinstance(args[n][1], int) and args[n][1] % 16 == 0))}
        key = json.dumps([name, sig, consts, opts, sorted(attrs)], sort_keys=True)
        if key in done:
            continue
        done.add(key)
        src = ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs)
        k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts)
        ptx = k.asm["ptx"]
        loads = {"wide": len(re.findall(r"ld\.global(?:\.\w+)*\.v[24]\.", ptx)),
                 "narrow": len(re.findall(r"ld\.global(?:\.\w+)*\.(?:b|u|s|f)(?:8|16)\b", ptx))}
        loads.update(registers(ptx))
        print(json.dumps([name, consts, opts, k.metadata.shared, loads]), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtypes", default="fp32,bf16")
    ap.add_argument("--dims", default="64,128", help="head sizes Dk = Dv")
    ap.add_argument("--families", default="additive,delta,glue")
    ap.add_argument("--kernels", default="", help="only these kernels, e.g. _delta_kkt_kernel (default: all)")
    ap.add_argument("--jobs", type=int, default=max(1, min(4, os.cpu_count() or 1)))
    ap.add_argument("--compile", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.compile:
        return compile_stdin()
    if a.jobs < 1:
        ap.error(f"--jobs={a.jobs}: expected an integer >= 1")
    known = {"dtypes": {"fp32", "bf16"}, "families": {"additive", "delta", "glue"}}
    for key, valid in known.items():
        if set(getattr(a, key).split(",")) - valid:
            ap.error(f"--{key}={getattr(a, key)!r}: comma-separated, from {sorted(valid)}")
    if not all(d.isdigit() and int(d) > 0 for d in a.dims.split(",")):
        ap.error(f"--dims={a.dims!r}: comma-separated head sizes such as 64,128")
    os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported
    import warnings

    warnings.simplefilter("ignore")
    only = [k for k in a.kernels.split(",") if k] or None
    found = launches(a.dtypes.split(","), [int(d) for d in a.dims.split(",")], a.families.split(","), only)
    if only and (missing := set(only) - {name for name, _, _ in found}):
        sys.exit(f"kernel_smem.py: --kernels: {', '.join(sorted(missing))} not launched by these families")
    print(f"{len(found)} launches recorded; compiling for sm_90 with {a.jobs} processes", flush=True)
    rows = compile_all(found, a.jobs)
    for name, consts, opts, shared, loads in sorted(rows, key=lambda r: -r[3]):
        c = " ".join(f"{k}={v}" for k, v in consts.items() if k in ("K", "V", "BK", "BV", "GATE", "DOT", "BOUNDED"))
        print(f"{shared:7d} B  {'OVER ' if shared > SM90_SHARED else ''}{name} {c} "
              f"warps={opts['num_warps']} stages={opts['num_stages']}  global loads: {loads['wide']} vector, "
              f"{loads['narrow']} of 1 or 2 bytes; {loads['regs']} registers, {loads['spills']} bytes spilled")
    over = [r for r in rows if r[3] > SM90_SHARED]
    print(f"{len(rows)} kernels compiled; {len(over)} need more than {SM90_SHARED} bytes")
    sys.exit(1 if over else 0)


if __name__ == "__main__":
    main()
