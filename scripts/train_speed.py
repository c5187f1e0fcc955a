"""
Training speed on one GPU, stage by stage, against the targets: train.py itself, as a user runs
it, on random weights of SmolLM2-135M and random tokens (speed depends on neither).

    python scripts/train_speed.py                                # stages 1, 2, 3, lm at 512 and 2048
    python scripts/train_speed.py --lengths=512 --stages=3,lm --extra="--compile=false"
    python scripts/train_speed.py --mixer=kda --out=speed.md
    python scripts/train_speed.py --mixer=attention --stages=2,3,lm --lengths=512   # floor of stages 2, 3
    python scripts/train_speed.py --gpus=1,2,4,8 --stages=3 --lengths=512   # DDP scaling through torchrun
    python scripts/train_speed.py --lengths=512 --stages=3,lm --trees=../base,.   # a change against its base
    python scripts/train_speed.py --lengths=512 --stages=3 --trees=../base,. --rounds=4   # ABBAABBA, medians

Each row is one `python train.py` run of --steps optimizer steps at train.py's GPU defaults
(micro-batch, accumulation, compile, ...), with the micro-batch's tokens kept as the length
changes (64 x 512 = 16 x 2048). Its speed is the log line of its last steps (the first steps
compile and warm up), its peak memory the most allocated in the whole run, evals included, and
its loss at the last step with its last val loss: a change for speed shows beside its base that
it trains the same numbers (random weights, the same seed).
`lm` is the teacher's own training step (--mixer=attention --stage=lm), the yardstick of the
stage-3 step. --mixer=attention distills a student that is a copy of the teacher: the floor of
stages 2 and 3, their teacher's pass and loss added to the teacher's own step, which no student
whose mixer costs at least what softmax attention does can beat. With more than one GPU a run goes
through torchrun (DistributedDataParallel) with the same micro-batch on every GPU; given several
counts, each stage and length is measured at each, and its efficiency is the tokens/s of n GPUs
over n times one GPU's. Rows print as they finish; --out also appends them to a file, and every
run's log stays under --work.

--trees compares checkouts of this project (another commit's files, from `git worktree add` or
`git archive`) in one run: each row runs on every tree in turn, the trees alternating row by
row, so that a machine's drift over the run falls on each alike. Each tree's own code builds its
teacher, student and corpus (the same seed, so the same numbers where its code is the same) and
runs its own train.py, at this tree's micro-batch and length, its own defaults otherwise; a tree
needs this script's setup() (every commit since 3b11c0f has it). With --rounds=N each row runs N
times on each tree, the order turned every round (A B, B A, A B, ...), and the comparison takes
each tree's median over its N runs, printed with their range: over an even number of rounds a
drift linear in time falls on each tree alike, and the median sets aside a run that stands apart
(a machine's first after an idle spell). Where one tree's runs spread over more than a change,
one pair of runs cannot tell the change from the spread.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from reproduce import NO_MULTICAST  # NVLink multicast off for every process torchrun starts

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

# tokens/s at length 512, and peak memory, that each stage should reach on one H200 (bf16)
TARGETS = {"1": 300_000, "2": 300_000, "3": 250_000, "lm": 350_000}
MAX_GIB = 40
RATIO = 1.5  # the stage-3 step's time per token at most this times the teacher's own (lm)
SCALING = 0.9  # n GPUs give at least this share of n times one GPU's tokens/s


def setup(work, mixer, tree=ROOT):
    """A random SmolLM2-135M teacher, a student of it (the start of stages 2 and 3) and a corpus of
    random tokens, under work/, by the code of tree (another checkout: in a process of its own).
    Returns (teacher path, student path, data folder)."""
    if os.path.realpath(tree) != os.path.realpath(ROOT):
        code = (f"import sys; sys.path[:0] = [{tree!r}, {os.path.join(tree, 'scripts')!r}]; "
                f"import json, train_speed; print(json.dumps(train_speed.setup({work!r}, {mixer!r})))")
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tree)
        if proc.returncode:
            tail = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
            raise RuntimeError(f"{tree}: building its teacher and student failed: {tail}")
        return tuple(json.loads(proc.stdout.strip().splitlines()[-1]))
    import torch

    import checkpoint
    import model as M

    teacher_pt, student_pt, data = (os.path.join(work, p) for p in ("teacher.pt", f"{mixer}.pt", "data"))
    if not os.path.exists(student_pt):
        torch.manual_seed(0)
        teacher = M.SmolLM2(M.Config())  # the defaults are SmolLM2-135M's
        checkpoint.save(teacher_pt, teacher)
        checkpoint.save(student_pt, checkpoint.student_from_teacher(teacher, mixer))
    os.makedirs(data, exist_ok=True)
    rng = np.random.default_rng(0)
    for split, n in (("train", 8_000_000), ("val", 200_000)):
        path = os.path.join(data, f"{split}.bin")
        if not os.path.exists(path):
            rng.integers(1, 49152, n, dtype=np.uint16).tofile(path)
    return teacher_pt, student_pt, data


def parse(log):
    """What a row reports of a train.py log: (tok/s, MFU, ms a step) of its last step line, the
    most memory it peaked at (GiB), its loss at that step and its last evaluation's val loss
    (the numbers a change for speed must keep). None without a step line."""
    steps = [line for line in log.splitlines() if line.startswith("step ")]
    if not steps:
        return None
    last = steps[-1]
    tok_s = float(re.search(r"([\d,]+) tok/s", last).group(1).replace(",", ""))
    mfu = re.search(r"mfu ([^ ]+)", last).group(1)
    ms = float(re.search(r"\| (\d+) ms \|", last).group(1))
    mem = re.findall(r"peak mem ([\d.]+) GiB", log)
    val = re.findall(r"^eval step \d+: val loss ([^ ]+)", log, re.M)
    return (tok_s, mfu, ms, float(mem[-1]) if mem else float("nan"),
            float(re.search(r" loss ([^ ]+) \|", last).group(1)), float(val[-1]) if val else float("nan"))


def order(n_trees, rounds):
    """(round, tree index) of a row's runs: each round runs every tree, the order turned every
    round (0 1, 1 0, 0 1, ...)."""
    return [(r, i if r % 2 == 0 else n_trees - 1 - i) for r in range(rounds) for i in range(n_trees)]


def summary(runs):
    """A tree's tokens/s over its runs of one row, as (median, text): the one value alone, or the
    median with the range and the count of runs."""
    med = statistics.median(runs)
    if len(runs) == 1:
        return med, f"{med:,.0f}"
    return med, f"{med:,.0f} (median; {min(runs):,.0f} to {max(runs):,.0f} over {len(runs)} runs)"


def run(args, stage, length, batch, gpus, paths, tree=ROOT, tag=""):
    """One train.py run of tree on `gpus` GPUs; returns parse()'s numbers of its log and the run's
    seconds. tag names the tree in the run's files."""
    teacher_pt, student_pt, data = paths
    name = f"stage{stage}_{length}" + (f"_{gpus}gpu" if gpus > 1 else "") + tag
    launcher = [sys.executable] if gpus == 1 else [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={gpus}"]
    cmd = launcher + [os.path.join(tree, "train.py"), f"--stage={stage}",
           f"--mixer={'attention' if stage == 'lm' else args.mixer}", f"--teacher={teacher_pt}",
           f"--data_dir={data}", f"--out_dir={os.path.join(args.work, 'out', name)}", f"--block_size={length}",
           f"--batch_size={batch}", f"--max_iters={args.steps}", f"--eval_interval={args.steps}",
           "--eval_iters=1", f"--log_interval={max(1, args.steps // 3)}", "--resume=false"]
    if stage in ("2", "3"):
        cmd.append(f"--init_from={student_pt}")
    cmd += args.extra.split()
    t0 = time.time()
    env = {**os.environ, **NO_MULTICAST} if gpus > 1 else None
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tree, env=env)
    log = proc.stdout + proc.stderr
    with open(os.path.join(args.work, name + ".log"), "w") as f:
        f.write(" ".join(cmd) + "\n" + log)
    numbers = parse(log)
    if proc.returncode or numbers is None:
        tail = log.strip().splitlines()[-1] if log.strip() else f"exit {proc.returncode}"
        raise RuntimeError(f"{name}: {tail} (log: {os.path.join(args.work, name + '.log')})")
    return *numbers, time.time() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mixer", default="gated_deltanet")
    ap.add_argument("--stages", default="1,2,3,lm")
    ap.add_argument("--lengths", default="512,2048")
    ap.add_argument("--steps", type=int, default=30, help="optimizer steps a run (the last third is timed)")
    ap.add_argument("--gpus", default="1", help="GPUs a run, or several counts (1,2,4,8): more than one runs "
                                                 "through torchrun, tokens/s of all together")
    ap.add_argument("--extra", default="", help="train.py settings added to every run, e.g. '--compile=false'")
    ap.add_argument("--work", default="", help="teacher, student, data and logs (default: a new temporary folder)")
    ap.add_argument("--out", default="", help="also append the table to this file")
    ap.add_argument("--trees", default="", help="checkouts of this project to compare, comma-separated "
                                                 "(default: this one), each row on each in turn")
    ap.add_argument("--rounds", type=int, default=1, help="runs of each row on each tree, the trees' order "
                                                          "turned every round; comparisons take each tree's median")
    args = ap.parse_args()
    trees = [os.path.abspath(t) for t in args.trees.split(",")] if args.trees else [ROOT]
    if bad := [t for t in trees if not os.path.isfile(os.path.join(t, "train.py"))]:
        ap.error(f"--trees: {bad[0]} holds no train.py (a checkout of this project, e.g. from "
                 f"`git worktree add DIR COMMIT`)")
    try:
        counts = [int(n) for n in args.gpus.split(",")]
    except ValueError:
        counts = [0]
    if min(counts + [args.steps]) < 1:
        ap.error(f"--steps={args.steps} and --gpus={args.gpus}: expected integers >= 1 (--gpus: one or a list, 1,2,4,8)")
    if args.rounds < 1:
        ap.error(f"--rounds={args.rounds}: expected an integer >= 1")
    if args.mixer == "attention" and "1" in args.stages.split(","):
        ap.error("--mixer=attention --stages=1: stage 1 trains a student's mixers, and a copy of the "
                 "teacher has none (stages 2, 3 and lm run)")
    import torch

    import model as M
    import train

    if torch.cuda.device_count() < max(counts):
        sys.exit(f"train_speed.py: needs {max(counts)} CUDA GPU(s), found {torch.cuda.device_count()} "
                 f"(train.py's GPU defaults are what it measures)")
    if args.mixer not in M.MIXERS:
        sys.exit(f"train_speed.py: --mixer={args.mixer!r}: expected one of {', '.join(M.MIXERS)}")
    stages = args.stages.split(",")
    if bad := [s for s in stages if s not in TARGETS]:
        sys.exit(f"train_speed.py: --stages: {bad[0]!r} is not one of {', '.join(TARGETS)}")
    try:
        lengths = [int(n) for n in args.lengths.split(",")]
    except ValueError:
        sys.exit(f"train_speed.py: --lengths={args.lengths!r}: expected numbers such as 512,2048")
    args.work = args.work or tempfile.mkdtemp(prefix="train_speed_")
    several = len(trees) > 1
    names = {t: os.path.basename(t.rstrip("/")) or t for t in trees}
    if several and len(set(names.values())) < len(trees):
        names = {t: f"{i}:{names[t]}" for i, t in enumerate(trees)}
    paths = {}
    for i, t in enumerate(trees):
        try:
            paths[t] = setup(os.path.join(args.work, f"tree{i}") if several else args.work, args.mixer, t)
        except RuntimeError as e:
            sys.exit(f"train_speed.py: {e}")
    d = train.GPU_DEFAULTS
    micro = d["batch_size"] * d["block_size"]  # tokens a micro-step

    def emit(line):
        print(line, flush=True)
        if args.out:
            with open(args.out, "a") as f:
                f.write(line + "\n")

    settings = " ".join(f"--{k}={v}" for k, v in d.items() if k not in ("max_iters", "eval_interval", "eval_iters",
                                                                         "log_interval", "device", "peak_tflops"))
    student = "attention (a copy of the teacher)" if args.mixer == "attention" else args.mixer
    emit(f"## train.py speed, {student} student of SmolLM2-135M (random weights): "
         f"{'/'.join(map(str, counts))} x {torch.cuda.get_device_name()}, "
         f"torch {torch.__version__}, {time.strftime('%Y-%m-%d')}\n\nGPU defaults: {settings}; "
         f"{args.steps} steps a run{'; ' + args.extra if args.extra else ''}"
         + (f"; trees, each row in this order: {', '.join(f'{names[t]} ({t})' for t in trees)}" if several else "")
         + (f"; {args.rounds} rounds, the order turned every round" if args.rounds > 1 else "")
         + "\n")
    named = several or args.rounds > 1  # a column names each run's tree (and its run)
    tree_col = ("| tree ", "|---") if named else ("", "")
    emit(f"{tree_col[0]}| stage | length x micro-batch | GPUs | tokens/s | target | MFU | step | peak memory | "
         f"loss (val) at the last step | run |")
    emit(f"{tree_col[1]}|---|---|---|---|---|---|---|---|---|---|")
    speed = {}  # (tree, stage, length, gpus) -> tokens/s of each of its runs
    for length in lengths:
        for stage in stages:
            batch = max(1, micro // length)
            for gpus in counts:
                for r, i in order(len(trees), args.rounds):
                    t = trees[i]
                    cell = f"| {names[t]}{f', run {r + 1}' if args.rounds > 1 else ''} " if named else ""
                    tag = (f"_tree{i}" if several else "") + (f"_run{r + 1}" if args.rounds > 1 else "")
                    try:
                        tok_s, mfu, ms, gib, loss, val, secs = run(args, stage, length, batch, gpus, paths[t], t, tag)
                    except RuntimeError as e:
                        emit(f"{cell}| {stage} | {length} x {batch} | {gpus} | failed: {e} | | | | | | |")
                        continue
                    speed.setdefault((t, stage, length, gpus), []).append(tok_s)
                    target = TARGETS[stage] * gpus
                    ok = "" if length != 512 else " (met)" if tok_s >= target else " (not met)"
                    emit(f"{cell}| {stage} | {length} x {batch} | {gpus} | {tok_s:,.0f} | {target:,}{ok} | {mfu} | "
                         f"{ms:.0f} ms | {gib:.1f} GiB{'' if gib <= MAX_GIB else ' (over ' + str(MAX_GIB) + ')'} | "
                         f"{loss:.4f} ({val:.4f}) | {secs:.0f} s |")
    med = {k: summary(v) for k, v in speed.items()}  # -> (median tokens/s, its text)
    if args.rounds > 1:
        emit("")
        for (t, stage, length, gpus), (_, text) in med.items():
            emit(f"{names[t]}: stage {stage}, length {length}, {gpus} GPU(s): {text} tokens/s")
    for t in trees:
        of = f"{names[t]}, " if several else ""
        for length in lengths:
            for gpus in counts:
                if (t, "3", length, gpus) in med and (t, "lm", length, gpus) in med:
                    r = med[t, "lm", length, gpus][0] / med[t, "3", length, gpus][0]
                    emit(f"\n{of}length {length}, {gpus} GPU(s): the stage-3 step takes {r:.2f}x the teacher's own "
                         f"step per token (target: at most {RATIO}x)")
        for (t2, stage, length, gpus), (tok_s, _) in med.items():
            if t2 == t and gpus > 1 and (t, stage, length, 1) in med:
                eff = tok_s / (gpus * med[t, stage, length, 1][0])
                emit(f"\n{of}stage {stage}, length {length}: {gpus} GPUs give {eff:.0%} of {gpus} times one GPU's "
                     f"tokens/s (target: at least {SCALING:.0%})")
    if several:  # each later tree against the first, row by row
        base = trees[0]
        for t in trees[1:]:
            for (t2, stage, length, gpus), (tok_s, _) in med.items():
                if t2 == t and (base, stage, length, gpus) in med:
                    emit(f"\n{names[t]} against {names[base]}: stage {stage}, length {length}, {gpus} GPU(s): "
                         f"{tok_s / med[base, stage, length, gpus][0] - 1:+.1%} tokens/s"
                         + (" (on the medians)" if args.rounds > 1 else ""))
    print(f"logs: {args.work}")


if __name__ == "__main__":
    main()
