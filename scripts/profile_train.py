"""
Profile the steps of a train.py run with torch.profiler: which operators take the time.

    python scripts/profile_train.py --steps=5 --mixer=gated_deltanet --stage=3     # any train.py settings
    python scripts/profile_train.py --steps=2 --stage=lm --mixer=attention --device=cpu
    python scripts/profile_train.py --eval --mixer=gated_deltanet --stage=3        # one evaluation instead

train.py runs as a user runs it, with these settings, from a fresh start (--resume=false), and
stops after WARMUP steps (first calls, compiles, the allocator) and --steps profiled ones, before
any checkpoint. Writes <out_dir>/<mixer>/stage<N>_profile.txt, the operators by their own time on
the device (on the CPU without one), and stage<N>_profile.json, a Chrome trace for
ui.perfetto.dev, and prints the wall time of a step beside the time the device was busy in it
(far apart: the step waits on the host). With --eval the same for one evaluation of the val
batches (--eval_iters of them): the run's first evaluation (at step 0, which compiles) is run
twice more, the second time profiled, and the run stops after its first step
(stage<N>_eval_profile.txt, .json).
"""

import argparse
import os
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile, schedule

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import distill  # noqa: E402
import train  # noqa: E402

WARMUP = 3  # steps after the first (which compiles) and before the profiled ones


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=5, help="optimizer steps to profile")
    ap.add_argument("--rows", type=int, default=40, help="operators in the table")
    ap.add_argument("--eval", action="store_true", help="profile one evaluation instead of steps")
    args, rest = ap.parse_known_args(sys.argv[1:] if argv is None else argv)
    if args.steps < 1 or args.rows < 1:
        ap.error(f"--steps={args.steps}, --rows={args.rows}: expected integers >= 1")
    if args.eval:
        return profile_eval(args, rest)
    n = 1 + WARMUP + args.steps
    rest = rest + ["--resume=false", f"--max_iters={n + 1}", f"--eval_interval={n + 1}", "--eval_iters=1"]
    s, _ = train.settings(rest)  # train.py's own checks, before any work
    cuda = s.device.startswith("cuda")
    # wait through the first step, warm up, then record: the step hook below advances it
    prof = profile(activities=activities(cuda), schedule=schedule(wait=1, warmup=WARMUP, active=args.steps,
                                                                  repeat=1))
    t0 = {}

    def after_step(step):
        if cuda:
            torch.cuda.synchronize()
        if step == 1 + WARMUP:
            t0["start"] = time.time()
        prof.step()
        return step == n  # stop before the last step's eval and checkpoint

    prof.start()
    train.main(rest, after_step=after_step)
    wall = (time.time() - t0["start"]) / args.steps
    prof.stop()
    write(prof, s, cuda, args, args.steps, wall, f"{args.steps} steps after {WARMUP} warm-up", "a step", "_profile")


def profile_eval(args, rest):
    """--eval: the first evaluation runs as train.py runs it, then twice more, the second time
    profiled; the run stops after its first step, before any checkpoint."""
    rest = rest + ["--resume=false", "--max_iters=2", "--eval_interval=2"]
    s, _ = train.settings(rest)
    cuda = s.device.startswith("cuda")
    real, got = distill.evaluate, {}

    def evaluate(*a, **kw):
        out = real(*a, **kw)  # the run's own: first calls and compiles
        if not got:
            real(*a, **kw)  # warm
            if cuda:
                torch.cuda.synchronize()
            with profile(activities=activities(cuda)) as prof:
                t0 = time.time()
                real(*a, **kw)
                if cuda:
                    torch.cuda.synchronize()
            got["prof"], got["wall"] = prof, time.time() - t0
        return out

    distill.evaluate = evaluate
    try:
        train.main(rest, after_step=lambda step: True)
    finally:
        distill.evaluate = real
    write(got["prof"], s, cuda, args, 1, got["wall"], f"one evaluation of {s.eval_iters} val batches",
          "an evaluation", "_eval_profile")


def activities(cuda):
    return [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])


def write(prof, s, cuda, args, n, wall, what, unit, suffix):
    """The table and the trace beside the checkpoint path, and the summary printed."""
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    ops = prof.key_averages()
    busy = sum(getattr(e, key) for e in ops if not e.key.startswith("ProfilerStep") and not e.is_user_annotation
               and (not cuda or e.device_type == torch.autograd.DeviceType.CUDA)) / 1e6 / n  # s per unit
    summary = (f"profile: {what}, {wall * 1000:.1f} ms {unit}, "
               f"{'device' if cuda else 'CPU in ops'} busy {busy * 1000:.1f} ms {unit} ({busy / wall:.0%})")
    base = train.ckpt_path(s)[:-3] + suffix
    with open(base + ".txt", "w") as f:
        # names whole: Inductor names a fused kernel after the operators in it, past the default 55 characters
        f.write(summary + "\n\n" + ops.table(sort_by=key, row_limit=args.rows, max_name_column_width=160) + "\n")
    prof.export_chrome_trace(base + ".json")
    print(f"{summary}\nwrote {base}.txt and {base}.json", flush=True)


if __name__ == "__main__":
    main()
