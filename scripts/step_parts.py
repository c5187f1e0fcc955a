"""
Where the time of a distillation step goes: its parts timed one by one on a GPU.

A stage-3 step is the teacher's forward pass, the student's forward and backward, and the loss
(CE + KL over the vocabulary). This script times each part, and the teacher's own training
step beside it, at one shape, with random weights of SmolLM2-135M (speed does not depend on
the weights), under bf16 autocast as train.py runs them:

    python scripts/step_parts.py                          # gated_deltanet, batch 8, length 2048
    python scripts/step_parts.py --mixer=kda --T=4096 --B=4
    python scripts/step_parts.py --profile          # and the kernels of one layer of each kind
    python scripts/step_parts.py --compile          # and both steps under torch.compile(fullgraph=True)

Each row is the mean wall time of 10 calls after 3 warm-ups, synchronized, so it counts the
Python and the kernel launches as a training step does; peak memory is the most allocated
during the row. Two last rows time one layer of each kind at batch 1, length 64, where the
GPU has almost no work: the host time (Python and launches) that bounds a step of a small
model. Prints a markdown table as the rows finish (--out also appends it to a file).
"""

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import checkpoint  # noqa: E402
import distill  # noqa: E402
import triton_ops  # noqa: E402
import mixers  # noqa: E402
import model as M  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mixer", default="gated_deltanet", choices=M.MIXERS[1:])
    ap.add_argument("--compile", action="store_true",
                    help="also time both micro-steps with the loss module under torch.compile(fullgraph=True)")
    ap.add_argument("--backend", default=None, choices=mixers.BACKENDS, help="the student's form (default: triton)")
    ap.add_argument("--B", type=int, default=8, help="sequences")
    ap.add_argument("--T", type=int, default=2048, help="tokens per sequence")
    ap.add_argument("--out", default="", help="also append the table to this file")
    ap.add_argument("--profile", action="store_true",
                    help="also list the kernels of one mixer layer and one attention layer, forward and backward")
    args = ap.parse_args()
    if min(args.B, args.T) < 1:
        ap.error(f"--B={args.B} and --T={args.T}: expected integers >= 1")
    if not torch.cuda.is_available():
        raise SystemExit("step_parts.py: needs a CUDA GPU (the parts are timed as train.py runs them there)")
    out = open(args.out, "a") if args.out else None

    def emit(line):
        print(line, flush=True)
        if out:
            out.write(line + "\n")
            out.flush()

    dev, B, T = "cuda", args.B, args.T
    torch.manual_seed(0)
    cfg = M.Config.from_preset("smollm2-135m")
    fp32_teacher = M.SmolLM2(cfg)
    student = checkpoint.student_from_teacher(fp32_teacher, args.mixer).to(dev).set_backend(args.backend)  # fp32 weights
    lm = checkpoint.student_from_teacher(fp32_teacher, "attention").to(dev)  # the teacher training itself
    teacher = fp32_teacher.to(dev, torch.bfloat16).eval().requires_grad_(False)  # frozen, as train.py keeps it
    x = torch.randint(0, cfg.vocab_size, (B, T), device=dev)
    y = torch.randint(0, cfg.vocab_size, (B, T), device=dev)
    ctx = torch.autocast("cuda", dtype=torch.bfloat16)

    def row(name, fn, n=10):
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        ms = (time.perf_counter() - t0) / n * 1000
        emit(f"| {name} | {ms:.2f} ms | {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB |")

    def step(net, stage, compiled=False):  # one micro-step of train.py: teacher pass, stage loss, backward
        loss_model = distill.StageLoss(net, stage, backend=args.backend)
        if compiled:  # fullgraph: a graph break (an op torch.compile cannot see into) is an error
            loss_model = torch.compile(loss_model, fullgraph=True)

        def run():
            with ctx:
                loss, _ = loss_model(x, y, distill.teacher_pass(teacher, x, stage))
            loss.backward()

        return run

    def teacher_forward():
        with ctx:
            distill.teacher_pass(teacher, x, "3")

    with ctx:
        t_out = distill.teacher_pass(teacher, x, "3")
        t_logits = teacher.lm_head(t_out["final"])
    z = torch.randn(B, T, cfg.vocab_size, device=dev, dtype=torch.bfloat16, requires_grad=True)
    hz = torch.randn(B, T, cfg.n_embd, device=dev, dtype=torch.bfloat16, requires_grad=True)

    def loss_autograd():  # the stage-3 loss through autograd: distill.py's definition
        distill.distill_loss(z, t_logits, y)[0].backward()

    def loss_fused():
        triton_ops.distill_loss(z.flatten(0, 1), t_logits.flatten(0, 1), y.flatten())[0].backward()

    def loss_head():
        with ctx:
            loss = triton_ops.head_loss(hz, student.lm_head.weight, y, t_out["final"], t_out["head"])[0]
        loss.backward()

    h = torch.randn(B, T, cfg.n_embd, device=dev, requires_grad=True)
    rope = student.rope(T, device=dev)

    def layer(mod):
        def run():
            with ctx:
                o = mod(h, rope)
            o.float().sum().backward()

        return run

    mixer = student.model.layers[0].self_attn
    qkv = torch.randn(B, T, 3 * cfg.n_embd, device=dev, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(3 * cfg.n_embd, 4, device=dev, requires_grad=True)
    conv = mixers.ShortConv(3 * cfg.n_embd, 4).to(dev)
    tail = torch.zeros(B, 3, 3 * cfg.n_embd, device=dev, dtype=torch.bfloat16)

    emit(f"## {args.mixer} student of SmolLM2-135M, batch {B}, length {T}: {torch.cuda.get_device_name()}, "
         f"torch {torch.__version__}, {time.strftime('%Y-%m-%d')}")
    emit("| part | time | peak memory |\n|---|---|---|")
    row("teacher's training micro-step (lm: forward, backward, CE)", step(lm, "lm"))
    row(f"stage-3 micro-step ({args.mixer}: teacher forward, student forward and backward, CE + KL)",
        step(student, "3"))
    if args.compile:
        row("teacher's training micro-step, torch.compile(fullgraph=True)", step(lm, "lm", compiled=True))
        row(f"stage-3 micro-step ({args.mixer}), torch.compile(fullgraph=True)", step(student, "3", compiled=True))
    row("  teacher forward (frozen, bf16 weights, final hidden states)", teacher_forward)
    row("  stage-3 loss, autograd (cross_entropy + kl_per_token), forward and backward", loss_autograd)
    row("  stage-3 loss, fused (distill_loss), forward and backward", loss_fused)
    row("  stage-3 loss with both LM heads, in slices of rows (head_loss), forward and backward", loss_head)
    row("  one softmax attention layer, forward and backward", layer(lm.model.layers[0].self_attn))
    row(f"  one {args.mixer} layer, forward and backward", layer(mixer))
    row("  short conv, PyTorch (F.conv1d and SiLU), forward and backward",
        lambda: conv(qkv, tail)[0].float().sum().backward())
    row("  short conv, kernel (one output, not cut into heads), forward and backward",
        lambda: triton_ops.short_conv(qkv, w).float().sum().backward())
    for name, mod in ((args.mixer, mixer), ("softmax attention", lm.model.layers[0].self_attn)):
        host_row(f"  host time of one {name} layer, forward and backward, batch 1, length 64", mod, student, emit)
    if args.profile:
        for name, mod in ((args.mixer, mixer), ("attention", lm.model.layers[0].self_attn)):
            emit(f"\n### the kernels of one {name} layer, forward and backward (10 calls)\n```")
            emit(kernel_table(layer(mod)))
            emit("```")


def host_row(name, mod, net, emit, n=50):
    """The time a layer's forward and backward take when the GPU has almost no work: the Python
    and the kernel launches alone (what bounds a step of a small model)."""
    h = torch.randn(1, 64, net.config.n_embd, device="cuda", requires_grad=True)
    rope = net.rope(64, device="cuda")

    def run():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            o = mod(h, rope)
        o.float().sum().backward()

    for _ in range(5):
        run()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        run()
    torch.cuda.synchronize()
    emit(f"| {name} | {(time.perf_counter() - t0) / n * 1000:.2f} ms | |")


def kernel_table(fn, n=10):
    """The device time of fn's kernels, summed over n calls, most first (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
    return prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=40, max_name_column_width=70)


if __name__ == "__main__":
    main()
