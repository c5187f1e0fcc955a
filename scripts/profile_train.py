"""
Profile the steps of a train.py run with torch.profiler: which operators take the time.

    python scripts/profile_train.py --steps=5 --mixer=gated_deltanet --stage=3     # any train.py settings
    python scripts/profile_train.py --steps=2 --stage=lm --mixer=attention --device=cpu

train.py runs as a user runs it, with these settings, from a fresh start (--resume=false), and
stops after WARMUP steps (first calls, compiles, the allocator) and --steps profiled ones, before
any checkpoint. Writes <out_dir>/<mixer>/stage<N>_profile.txt, the operators by their own time on
the device (on the CPU without one), and stage<N>_profile.json, a Chrome trace for
ui.perfetto.dev, and prints the wall time of a step beside the time the device was busy in it
(far apart: the step waits on the host).
"""

import argparse
import os
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile, schedule

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import train  # noqa: E402

WARMUP = 3  # steps after the first (which compiles) and before the profiled ones


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=5, help="optimizer steps to profile")
    args, rest = ap.parse_known_args(sys.argv[1:] if argv is None else argv)
    if args.steps < 1:
        ap.error(f"--steps={args.steps}: expected an integer >= 1")
    n = 1 + WARMUP + args.steps
    rest = rest + ["--resume=false", f"--max_iters={n + 1}", f"--eval_interval={n + 1}", "--eval_iters=1"]
    s, _ = train.settings(rest)  # train.py's own checks, before any work
    cuda = s.device.startswith("cuda")
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    # wait through the first step, warm up, then record: the step hook below advances it
    prof = profile(activities=acts, schedule=schedule(wait=1, warmup=WARMUP, active=args.steps, repeat=1))
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

    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    ops = prof.key_averages()
    busy = sum(getattr(e, key) for e in ops if not e.key.startswith("ProfilerStep") and not e.is_user_annotation
               and (not cuda or e.device_type == torch.autograd.DeviceType.CUDA)) / 1e6 / args.steps  # s a step
    summary = (f"profile: {args.steps} steps after {WARMUP} warm-up, {wall * 1000:.1f} ms a step, "
               f"{'device' if cuda else 'CPU in ops'} busy {busy * 1000:.1f} ms a step ({busy / wall:.0%})")
    base = train.ckpt_path(s)[:-3]
    with open(base + "_profile.txt", "w") as f:
        f.write(summary + "\n\n" + ops.table(sort_by=key, row_limit=40) + "\n")
    prof.export_chrome_trace(base + "_profile.json")
    print(f"{summary}\nwrote {base}_profile.txt and {base}_profile.json", flush=True)


if __name__ == "__main__":
    main()
