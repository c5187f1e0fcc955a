"""
The study's comparison at 135M, one student a command: stages 1 -> 2 -> 3 with the study's split
of the token budget, then SFT on the offline instruction data, and after stage 3 and after SFT
the whole evaluation. One small JSON a run holds its settings, commit, machine, times, every
number and its loss curves; scripts/report.py builds the table and the plots from them.

    python scripts/reproduce.py --mixer=kda --tokens=100M                 # one GPU
    python scripts/reproduce.py --mixer=gated_deltanet --softmax_layers=5,15,25 --name=hybrid
    python scripts/reproduce.py --teacher                                 # the teacher, evaluated once
    python scripts/reproduce.py --mixer=gla --long_context=2048           # stage 3's last quarter at 2k
    python scripts/reproduce.py --mixer=swa --tokens=6k --sft_tokens=2k --mc_limit=4 \\
        --niah="--lengths=256 --samples=1 --depths=50" --maturity=0.25,0.5 \\
        --maturity_niah="--tasks=s_niah_1 --lengths=256 --samples=1 --depths=50"  # a CPU run (~15 min)

The budget splits as the study's 80M : 160M : 2.76B tokens (distill.STAGES: 2.7% / 5.3% / 92%),
each stage a whole number of train.py's optimizer steps; SFT gets --sft_tokens (default a tenth
of the budget, at most one pass over its corpus) at length 1024. <-- vs the study: it runs SFT
for one epoch of SmolTalk, which is not offline. Every run uses the same teacher, data, seed,
state size and short-conv setting (train.py's defaults); a stage of more than COMPILE_TOKENS
tokens runs under torch.compile on a GPU (SFT and sft_kd among them at 100M), the shorter ones
eagerly.

Each step is one command a user could type (train.py, evaluate.py, niah.py), run by that script's
main() inside this process, so that Python, CUDA and the kernels that earlier
steps compiled are paid for once a run (--isolate: each step its own process, as typed); its log
goes to <work>/<name>/<step>.log. The steps done are kept in <work>/<name>/done.json (written whole, then
renamed): run the same command again after a kill and it goes on from the step it stopped in,
train.py from that stage's last checkpoint. The run's JSON is written when it starts and after
every step, so a run cut short keeps what it measured; its "incomplete" names the steps to run.
Evaluation: perplexity and KL to the teacher on held-out text (data/modern/val.bin), the study's
six tasks with recovery (--mc_limit questions each), and needle in a haystack (--niah: the
passkey S-NIAH-1 and the UUID S-NIAH-3 at 512 to 4k tokens, 50 prompts a length). Each step
ends with its own clock's line (cli.Clock: start-up and loading, the first step's compiling,
training or evaluating proper, checkpoint writes); the JSON's "time_table" (by step) and
"time_groups" (by part: a stage, the evaluation after one, the maturity points) and the run's
last lines say where its seconds went.

Maturity (--maturity, fractions of the budget; default 1/8, 1/4, 1/2): stage 3 also keeps its
weights at those points (train.py --keep_at), and each gets a light evaluation after stage 3:
perplexity and KL, LAMBADA (--maturity_tasks) and the passkey at 512 to 2k tokens
(--maturity_niah). Its cost is in the JSON's "seconds" (eval_mature*, niah_mature*).
Long-context distillation (--long_context=L, --long_frac=f, default a quarter): stage 3's last f
of steps on sequences of L tokens (train.py --long_block_size, --long_frac), the micro-batch cut so
that tokens per step, and the budget, stay the baseline's; every other stage as the baseline. The
run is <name>_long<L> (and _frac<f> off the default share), beside its baseline, and its NIAH goes
to 8k (NIAH_LONG) unless --niah says otherwise. Its steps before the switch are the baseline's, so
its maturity points repeat the baseline's (--maturity= skips them). --long_niah measures a run to
8k without training anything new: a baseline's own command with it reruns its NIAH steps alone;
the teacher's (--teacher --long_niah, or --long_context) is teacher_long, beside teacher.json.
A baseline run whole with --long_niah also keeps stage 3's whole checkpoint at the switch of a
long last quarter and half (BRANCH_FRACS) and of --long_frac if given (train.py --branch_at); a long-context run of the same recipe in the same --work then
starts there: stages 1 and 2, stage 3's steps before the switch and its maturity points are the
baseline's files (linked; 0 s in its time table, and its JSON's "branched_from" names them),
which are what it would train itself (to the bit in tests/test_long_context.py's tiny CPU run), and
it trains only the long steps.
Instruction-aware distillation (--sft_kd): from the same stage-3 student, train.py's stage
sft_kd (SFT's data, length and budget; CE + KL to the instruction-tuned teacher on the
assistant's tokens), evaluated as SFT is, beside it. The teacher's
task scores are measured in the evaluation after stage 3 and read back from it after SFT
(evaluate.py --teacher_eval), which checks that the teacher's held-out loss agrees.
"""

import argparse
import contextlib
import gc
import io
import json
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
import cli  # noqa: E402

STAGES = ("1", "2", "3")
# a stage this long compiles on a GPU. In the KDA run of 2026-12-05 (one H100) compiling a block at
# a time cost stage 3 about 15 s (its first step 8.6 s, its first evaluation 6.6 s over the
# others), and a compiled step of 32,768 tokens is some 80 ms shorter than an eager one (SFT eager:
# 289 ms; stage 3 compiled, the teacher's forward included: 242 ms): it pays back past about 190
# steps, 6M tokens. At 100M: stages 1 and 2 (2.7M, 5.3M) eager, SFT and sft_kd (10M) compiled.
COMPILE_TOKENS = 8_000_000
SFT_LENGTH = 1024  # the study's SFT sequence length
NIAH = "--tasks=s_niah_1,s_niah_3 --lengths=512,1024,2048,4096 --depths=0,25,50,75,100 --samples=10"
NIAH_LONG = NIAH.replace("4096", "4096,8192")  # long-context runs, and a baseline or teacher beside them
LONG_FRAC = 0.25  # --long_frac's default: the last quarter of stage 3 at --long_context
BRANCH_FRACS = (0.25, 0.5)  # a baseline's (--long_niah) kept starts of long-context runs, besides --long_frac
MATURITY_NIAH = "--tasks=s_niah_1 --lengths=512,1024,2048 --depths=0,25,50,75,100 --samples=10"
HISTORY_POINTS = 200  # train-loss points kept per stage in the JSON
# sliding-window attention (swa) at the linear students' state size: SmolLM2-135M's 3 KV heads
# keep 96 keys and values of 64 channels, 36,864 numbers a layer, as a student's 9 heads of 64 x 64
# state do. train.py's own default (512) would equal the teacher at the distillation length
SWA_WINDOW = 96
# --all: the seven students, a hybrid and the sliding-window baseline, then the teacher. The
# hybrid keeps one softmax layer in the middle of each third of the 30 layers, evenly spaced as
# hybrids usually interleave them, so that every part of the depth can read the exact context
RUNS = {**{m: [f"--mixer={m}"] for m in ("linear_attention", "retnet", "gla", "mlstm", "deltanet", "gated_deltanet",
                                         "kda")},
        "hybrid": ["--mixer=gated_deltanet", "--softmax_layers=5,15,25", "--name=hybrid"],
        "swa": ["--mixer=swa"], "teacher": ["--teacher"]}
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def tokens(text):
    """'100M' -> 100_000_000 (k, M, B suffixes; plain integers too)."""
    m = re.fullmatch(r"\s*([\d.]+)\s*([kKmMbB]?)\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a token count such as 100M, 2.5B or 60k")
    n = float(m[1]) * {"": 1, "k": 1e3, "m": 1e6, "b": 1e9}[m[2].lower()]
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected at least one token")
    return int(n)


def split(budget):
    """The study's share of each distillation stage in a budget of tokens: {stage: tokens}."""
    import distill

    full = {s: distill.STAGES[s]["tokens"] for s in STAGES}
    return {s: round(budget * n / sum(full.values())) for s, n in full.items()}


def machine():
    """The GPU's name, or the CPU's, in words."""
    import torch

    if torch.cuda.is_available():
        return f"{torch.cuda.device_count()} x {torch.cuda.get_device_name()}, torch {torch.__version__}"
    return f"CPU {platform.processor() or platform.machine()} ({os.cpu_count()} cores), torch {torch.__version__}"


def commit():
    """HEAD's hash, with '+changes' when the tracked files differ from it."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True).stdout.strip()
        return head + ("+changes" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def write_json(path, obj):
    """Write obj whole to a temporary file, then rename it over path: a kill leaves the old file."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(tmp, path)


class Pipeline:
    """The steps of one run, each skipped when <work>/<name>/done.json says it finished with the
    same settings."""

    def __init__(self, work, name, settings, isolate=False):
        self.dir = os.path.join(work, name)
        os.makedirs(self.dir, exist_ok=True)
        self.state_path = os.path.join(self.dir, "done.json")
        state = json.load(open(self.state_path)) if os.path.exists(self.state_path) else {"settings": settings}
        if state["settings"] != settings:
            sys.exit(f"reproduce.py: {self.dir} holds a run with other settings ({state['settings']}); "
                     f"give another --name or --work, or remove that folder")
        self.settings, self.done = settings, state.get("steps", {})
        self.after = None  # called after each step that runs
        self.isolate = isolate  # each step a process of its own (--isolate)

    def finished(self, name, key=None):
        """Step `name` is done, with the same key: an evaluation's own settings, which may change
        without training again."""
        return name in self.done and self.done[name].get("key") == key

    def step(self, name, cmd, key=None):
        """Run cmd ([python, script, settings...]) unless step `name` is finished; its output goes
        to <dir>/<name>.log. The script's main() runs in this process (isolate: as a process of its
        own), so that Python, CUDA and the kernels compiled by earlier steps start once a run."""
        if self.finished(name, key):
            print(f"{name}: done ({self.done[name]['seconds']:.0f} s)", flush=True)
            return
        log = os.path.join(self.dir, name + ".log")
        print(f"{name}: {' '.join(shlex.quote(c) for c in cmd)}", flush=True)
        t0 = time.time()
        with open(log, "w") as f:
            out = StepOutput(f)
            error = (run_process if self.isolate else run_here)(cmd, out)
            out.flush()
        if error:
            tail = open(log).read().strip().splitlines()[-3:]
            print("\n".join(f"  {t}" for t in tail), file=sys.stderr)
            sys.exit(f"reproduce.py: step {name} failed ({error}); its log: {log}; "
                     f"the same command goes on from this step")
        self.record(name, time.time() - t0, key=key, split=out.split)
        if self.after:
            self.after()

    def record(self, name, seconds, **entry):
        """Step `name` done in so many seconds (with entry's fields), in done.json at once."""
        self.done[name] = {"seconds": seconds, "finished": time.strftime("%Y-%m-%d %H:%M:%S"), "key": None,
                           "split": None, **entry}
        write_json(self.state_path, {"settings": self.settings, "steps": self.done})


class StepOutput(io.TextIOBase):
    """A step's output: all of it to its log, its progress lines to the terminal, and its clock's
    line (cli.Clock) read into `split`."""

    SHOWN = ("eval", "step", "stage", "warning", "wrote", "S-NIAH", "|", "time:")

    def __init__(self, log):
        self.log, self.part, self.split = log, "", None
        self.terminal = sys.stdout  # taken before the step's output is redirected here

    def writable(self):
        return True

    def write(self, text):
        self.log.write(text)
        *lines, self.part = (self.part + text).split("\n")
        for line in lines:
            if line.startswith("time:"):
                self.split = cli.read_time(line)
            if line.startswith(self.SHOWN):
                print(f"  {line.rstrip()}", file=self.terminal, flush=True)
        return len(text)

    def flush(self):
        self.log.flush()


class Stop(BaseException):
    """SIGTERM: unwinds through a step running in this process (never caught as its failure)."""


def run_process(cmd, out):
    """cmd as a process of its own, its output into out; an error's words, or None."""
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        for line in proc.stdout:
            out.write(line)
    finally:  # stopped (SIGTERM, Ctrl-C): the step's process stops too
        if proc.poll() is None:
            proc.terminate()
            proc.wait()
    return f"exit {proc.returncode}" if proc.wait() else None


def run_here(cmd, out):
    """cmd's script (train.py, evaluate.py or niah.py) run by its main() in this process, its
    output into out; an error's words, or None. Its GPU memory is given back afterwards."""
    import traceback

    import torch

    import evaluate
    import niah
    import train

    main = {"train.py": train.main, "evaluate.py": evaluate.main, "niah.py": niah.main}[cmd[1]]
    error, here = None, os.getcwd()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            os.chdir(ROOT)  # where its paths start, as for a process of its own (run_process)
            main(cmd[2:])
        except SystemExit as e:  # the scripts' one-line errors
            if e.code not in (None, 0):
                if isinstance(e.code, str):  # as Python prints it at a process's exit
                    print(e.code)
                error = f"exit {e.code if isinstance(e.code, int) else 1}"
        except Exception as e:  # noqa: BLE001 -- a step's failure is reported, then the run stops
            traceback.print_exc()
            error = f"{type(e).__name__}: {e}".splitlines()[0]
        finally:
            os.chdir(here)
    torch._dynamo.reset()  # compiled graphs of this step's models: gone with them
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return error


def stage_history(path):
    """A finished stage's curves from its checkpoint: train loss (thinned to HISTORY_POINTS) and
    every eval, with its settings' step count."""
    import torch

    state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    train = state["history"]["train"]
    every = max(1, len(train) // HISTORY_POINTS)
    return {"steps": state["step"], "train": [list(p) for p in train[::every]], "val": state["history"]["val"]}


def niah_table(path):
    """{task: {length: accuracy over every depth}} from niah.py's results.json."""
    out = {}
    for r in json.load(open(path))["accuracy"]:
        if r["depth"] == "all":
            out.setdefault(r["task"], {})[str(r["length"])] = r["accuracy"]
    return out


def step_key(name, args):
    """The settings a step is done with: an evaluation's own (None for training, whose settings are
    the run's); the maturity points' light ones."""
    if name.startswith(("eval_mature", "niah_mature")):
        return maturity_args(args)[0 if name.startswith("eval_") else 1]
    return eval_args(args) if name.startswith("eval_") else words("--niah", args.niah) if name.startswith("niah_") else None


def maturity_args(args):
    """(evaluate.py's, niah.py's) settings at a maturity point: the run's, with fewer tasks and lengths."""
    evaluation = [a for a in eval_args(args) if not a.startswith("--tasks=")] + [f"--tasks={args.maturity_tasks}"]
    return evaluation, words("--maturity_niah", args.maturity_niah)


def write_results(path, result, pipe, args, ckpt, t0):
    """The run's JSON with everything measured so far. It is written after every step, so a run cut
    short keeps its numbers and loss curves; "incomplete" then names the steps still to run."""
    r = dict(result)
    tags = (("teacher", "teacher"),) if args.teacher else (("stage3", "after_stage3"), ("sft", "after_sft"),
                                                          ("sft_kd", "after_sft_kd"))
    for tag, field in tags:
        if (m := numbers(pipe, tag, args)) is not None:
            r[field] = m
    points = result.get("settings", {}).get("maturity", {})  # distillation tokens -> stage-3 step
    for n in points:
        if (m := numbers(pipe, f"mature{n}", args)) is not None:
            r.setdefault("maturity", {})[n] = {"tokens": int(n), **m}
    if ckpt:
        r["history"] = {s: stage_history(p) for s, p in ckpt.items()
                        if pipe.finished(f"stage{s}") and os.path.exists(p)}  # a folder copied without them
    if src := next((d for d in pipe.done.values() if d.get("from")), None):
        r["branched_from"] = {"run": src["from"], "stage3_step": src["at"]}
    r["seconds"] = {k: v["seconds"] for k, v in pipe.done.items()}
    r["time_table"] = time_table(pipe.done)
    r["time_groups"] = time_table(pipe.done, grouped=True)
    r["this_run_seconds"] = time.time() - t0
    steps = ["eval_teacher", "niah_teacher"] if args.teacher else [f"stage{s}" for s in STAGES] + [
        "eval_stage3", "niah_stage3"] + [f"{k}_mature{n}" for n in points for k in ("eval", "niah")] + [
        "stagesft", "eval_sft", "niah_sft"] + (["stagesft_kd", "eval_sft_kd", "niah_sft_kd"] if args.sft_kd else [])
    if missing := [n for n in steps if not pipe.finished(n, step_key(n, args))]:
        r["incomplete"] = "not run yet: " + ", ".join(missing)
    write_json(path, r)


PHASES = {"startup": "start-up and loading", "first step": "compiling (first step)",
          "steps": "training", "held-out text": "evaluating", "tasks": "evaluating", "prompts": "evaluating",
          "evals": "evaluations in training", "checkpoints": "checkpoint writes", "writing": "checkpoint writes"}


AFTER_STEP = {"stage3": "stage 3", "sft": "SFT", "sft_kd": "sft_kd", "teacher": "the teacher"}


def step_group(name):
    """A step's row in the grouped time table: its stage, the evaluation (tasks and NIAH) after
    one, or the maturity points together."""
    if "_mature" in name:
        return "maturity points (LAMBADA, passkey)"
    if name.startswith("stage"):
        stage = name[len("stage"):]
        return f"stage {stage}" if stage in STAGES else AFTER_STEP.get(stage, stage)
    return f"evaluation of {AFTER_STEP.get(name.split('_', 1)[1], name)} (tasks, NIAH)"


def time_table(done, grouped=False):
    """Where a run's seconds went, a markdown table: each step's wall time split by its own clock
    (cli.Clock's phases, grouped as PHASES) and the rest ("process": the time outside the step's
    clock: its imports, and with --isolate Python's and CUDA's start). grouped: a row per
    step_group, its steps added before rounding."""
    cols = list(dict.fromkeys(PHASES.values())) + ["process", "total"]
    rows = {}
    for name, d in done.items():
        split = d.get("split") or {}
        cells = rows.setdefault(step_group(name) if grouped else name, dict.fromkeys(cols, 0.0))
        for phase, sec in split.items():
            if phase in PHASES:
                cells[PHASES[phase]] += sec
        cells["process"] += d["seconds"] - split.get("total", 0.0)
        cells["total"] += d["seconds"]
    rows["all"] = {c: sum(cells[c] for cells in rows.values()) for c in cols}
    return ["| step | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"] + [
        f"| {name} | " + " | ".join(f"{cells[c]:.0f}" for c in cols) + " |" for name, cells in rows.items()]


def measure(pipe, tag, model, args, py, teacher_eval=None):
    """Steps eval_<tag> and niah_<tag> on `model`, a checkpoint or "teacher" (evaluate.py's and
    niah.py's --init_from); teacher_eval: an earlier evaluation of this run, to take the teacher's
    task scores from (evaluate.py --teacher_eval)."""
    ev, niah_dir = os.path.join(pipe.dir, f"{tag}.eval.json"), os.path.join(pipe.dir, f"{tag}.niah")
    teacher = [f"--teacher_eval={teacher_eval}"] if teacher_eval and os.path.exists(teacher_eval) else []
    evaluation, niah = step_key(f"eval_{tag}", args), step_key(f"niah_{tag}", args)
    pipe.step(f"eval_{tag}", [py, "evaluate.py", f"--init_from={model}"] + evaluation + [f"--out={ev}"] + teacher,
              key=evaluation)
    pipe.step(f"niah_{tag}", [py, "niah.py", f"--init_from={model}", f"--out_dir={niah_dir}"] + niah, key=niah)


def numbers(pipe, tag, args):
    """What eval_<tag> and niah_<tag> have measured so far, with this run's settings: {"eval",
    "niah"} ({} for a NIAH not finished), or None before the evaluation."""
    if not pipe.finished(f"eval_{tag}", step_key(f"eval_{tag}", args)):
        return None
    out = json.load(open(os.path.join(pipe.dir, f"{tag}.eval.json")))
    niah = os.path.join(pipe.dir, f"{tag}.niah", "results.json")
    return {"eval": {k: out[k] for k in ("model", "teacher", "summary") if k in out},
            "niah": niah_table(niah) if pipe.finished(f"niah_{tag}", step_key(f"niah_{tag}", args)) else {}}


def run_all(argv, runs, gpus, work):
    """Every run of `runs` as its own reproduce.py process, one a GPU at a time (CUDA_VISIBLE_DEVICES
    set to it; one after another without GPUs), the other settings of argv passed on to each; its
    output in <work>/<name>.out. Returns the names of the runs that failed."""
    queue, busy, failed = list(runs), {}, []
    try:
        while queue or busy:
            for slot in gpus or [None]:
                if slot not in busy and queue:
                    name = queue.pop(0)
                    env = {**os.environ, **NO_MULTICAST, "PYTHONUNBUFFERED": "1"}
                    if slot is not None:
                        env["CUDA_VISIBLE_DEVICES"] = str(slot)
                    log = open(os.path.join(work, name + ".out"), "w")
                    cmd = [sys.executable, os.path.abspath(__file__)] + argv + RUNS[name]
                    busy[slot] = (name, subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT),
                                  log)
                    print(f"{name}: started{'' if slot is None else f' on GPU {slot}'} (log {log.name})", flush=True)
            time.sleep(0.5)
            for slot, (name, proc, log) in list(busy.items()):
                if proc.poll() is not None:
                    log.close()
                    del busy[slot]
                    print(f"{name}: {'finished' if proc.returncode == 0 else f'failed (exit {proc.returncode})'}",
                          flush=True)
                    if proc.returncode:
                        failed.append(name)
    finally:  # a stopped --all stops its runs too (each goes on from its last step when started again)
        for name, proc, log in busy.values():
            proc.terminate()
            proc.wait()
            log.close()
    return failed


def words(option, text):
    """An option's settings for another script, split as a shell would; a one-line exit if they do not split."""
    try:
        return shlex.split(text)
    except ValueError as e:
        sys.exit(f"reproduce.py: {option}={text!r}: {e}")


def maturity_steps(args, steps, per_step):
    """{distillation tokens: stage-3 step} of the --maturity points, or a one-line exit for a point
    outside stage 3."""
    try:
        fractions = [float(f) for f in args.maturity.split(",") if f.strip()]
    except ValueError:
        sys.exit(f"reproduce.py: --maturity={args.maturity!r}: expected fractions of --tokens such as 0.125,0.25,0.5")
    before = (steps["1"] + steps["2"]) * per_step  # stage 3 starts after these tokens
    points = {}
    for f in fractions:
        k = round((f * args.tokens - before) / per_step)
        if not 0 < k < steps["3"]:
            sys.exit(f"reproduce.py: --maturity: {f} of {args.tokens:,} tokens is not inside stage 3 (its tokens "
                     f"{before:,} to {before + steps['3'] * per_step:,}): give fractions inside it, or --maturity= "
                     f"for none")
        points[str(before + k * per_step)] = k
    return points


def eval_args(args):
    """evaluate.py's settings for every evaluation of this run."""
    return [f"--data={args.val}", f"--mc_limit={args.mc_limit}", f"--tasks={args.tasks}"] + words("--eval_extra", args.eval_extra)


def check_settings(args):
    """The settings passed on to train.py, evaluate.py and niah.py, checked by their own parsers
    before any work (a bad one would otherwise surface after training)."""
    import cli
    import evaluate
    import niah
    import train

    for script, parse, argv in (("evaluate.py", evaluate.settings, eval_args(args)),
                                ("niah.py", niah.settings, words("--niah", args.niah))):
        try:
            parse(argv)
        except SystemExit as e:
            if e.code:  # the script printed its message above
                sys.exit(f"reproduce.py: {script} refuses these settings: {' '.join(argv)}")
    given = cli.parse(words("--extra", args.extra), train.Settings, train.fail)  # train.py's own one-line errors
    for key in ("max_iters", "keep_at", "branch_at"):
        if key in given:
            sys.exit(f"reproduce.py: --extra: --{key} is set for each stage from --tokens (and --maturity, "
                     f"--long_niah)")
    if "window" in given:
        sys.exit("reproduce.py: --extra: --window is reproduce.py's own setting (--window=N)")
    for key in ("long_block_size", "long_frac"):
        if key in given:
            sys.exit(f"reproduce.py: --extra: --{key} is reproduce.py's own setting (--long_context, --long_frac)")
    if args.window < 1:
        sys.exit(f"reproduce.py: --window={args.window}: expected an integer >= 1")
    for key in ("batch_size", "block_size", "grad_accum"):
        if given.get(key, 1) < 1:
            sys.exit(f"reproduce.py: --extra: --{key}={given[key]}: expected an integer >= 1")
    if args.softmax_layers:  # against the teacher's layers, before a results file is written
        n_layer = teacher_config(given).n_layer
        try:
            cli.check_softmax_layers(args.softmax_layers, n_layer)
        except ValueError as e:
            sys.exit(f"reproduce.py: --softmax_layers={args.softmax_layers!r}: {e}")
    return given


def teacher_config(given):
    """The model.Config of the run's teacher (--extra's --teacher, or train.py's default), read
    from its file (checkpoint.read, which reads the weights too), or a one-line exit."""
    import checkpoint
    import train

    teacher = given.get("teacher", train.Settings.teacher)
    try:
        return checkpoint.read(teacher)[0]
    except (OSError, ValueError) as e:
        sys.exit(f"reproduce.py: --extra: --teacher={teacher}: {str(e).splitlines()[0]}")


def run_name(args):
    """The run's name, its folder under --work and its JSON: "teacher", or --name (default the
    mixer's); a long-context run adds _long<L> (and _frac<f> off the default share), so that it
    never overwrites its baseline, and the teacher measured to 8k is teacher_long."""
    if args.teacher:
        return "teacher_long" if args.long_context or args.long_niah else "teacher"
    name = args.name or args.mixer
    if args.long_context:
        name += f"_long{args.long_context}" + ("" if args.long_frac == LONG_FRAC else f"_frac{args.long_frac:g}")
    return name


def branch(args, pipe, settings, switch):
    """A long-context run's start, taken from its baseline in the same --work: links its stages 1
    and 2, its whole stage-3 checkpoint at the switch (kept by train.py --branch_at) and its kept
    maturity weights into this run's folder, and marks stages 1 and 2 done. Only for the same
    recipe, a baseline that kept all of them, and a run that has not begun stage 3."""
    name = run_name(argparse.Namespace(**{**vars(args), "long_context": 0}))
    base, mine = os.path.join(args.work, name, args.mixer), os.path.join(pipe.dir, args.mixer)
    kept = {os.path.join(base, f"stage3_branch{switch}.pt"): "stage3.pt",
            **{os.path.join(base, f"stage{s}.pt"): f"stage{s}.pt" for s in ("1", "2")},
            **{os.path.join(base, f"stage3_step{k}.pt"): f"stage3_step{k}.pt"
               for k in settings["maturity"].values() if k <= switch}}  # later ones are this run's own
    done = os.path.join(args.work, name, "done.json")
    if pipe.finished("stage3") or os.path.exists(os.path.join(mine, "stage3.pt")) or not os.path.exists(done) \
            or not all(os.path.exists(f) for f in kept):
        return
    theirs = json.load(open(done))["settings"]
    recipe = ("mixer", "softmax_layers", "tokens", "tokens_per_step", "text", "extra", "window")
    if any(theirs.get(k) != settings.get(k) for k in recipe) or any(
            theirs["steps"].get(s) != settings["steps"][s] for s in STAGES):
        return
    os.makedirs(mine, exist_ok=True)
    for src, dst in kept.items():  # links where the file system allows, else copies
        try:
            os.link(src, os.path.join(mine, dst))
        except OSError:
            shutil.copyfile(src, os.path.join(mine, dst))
    for s in ("1", "2"):
        pipe.record(f"stage{s}", 0.0, **{"from": name, "at": switch})
    print(f"stages 1 and 2, and stage 3's first {switch} steps: {name}'s, from {base}", flush=True)


def check_long(args, given, batch, block, stage3_steps):
    """train.py's checks of --long_block_size and --long_frac on stage 3 (distill.check_long, the
    teacher's context included), as a one-line exit before any step."""
    from types import SimpleNamespace

    import distill

    s = SimpleNamespace(stage="3", block_size=block, batch_size=batch, max_iters=stage3_steps,
                        long_block_size=args.long_context, long_frac=args.long_frac)
    try:
        distill.check_long(s, teacher_config(given).max_seq_len)
    except ValueError as e:
        sys.exit(f"reproduce.py: --long_context={args.long_context}: {e}")


def check_inputs(args):
    """One line, before any work, for what a run needs and does not find."""
    need = [(args.val, "python data/modern/prepare.py")]
    if "--mc_dir" not in args.eval_extra:
        need.append((os.path.join("data", "mc_offline", "arc_easy.jsonl"), "python data/mc_offline/prepare.py"))
    if not args.teacher:
        need += [(os.path.join(args.text, "train.bin"), "python data/modern/prepare.py"),
                 (os.path.join(args.chat, "train.bin"), "python data/sharegpt/prepare.py")]
    for path, fix in need:
        if not os.path.exists(os.path.join(ROOT, path)):
            sys.exit(f"reproduce.py: {path} not found; build it with: {fix}")
    import checkpoint
    import model as M

    try:
        if not args.teacher:
            M.check_mixer(args.mixer, M.MIXERS[1:])
        checkpoint.check_writable(args.work, f"--work={args.work}")
        checkpoint.check_writable(args.results, f"--results={args.results}")
    except ValueError as e:
        sys.exit(f"reproduce.py: {e}")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if __name__ == "__main__":  # a stop (kill, timeout) unwinds, so the processes it started stop too
        signal.signal(signal.SIGTERM, stop)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                 allow_abbrev=False)
    ap.error = lambda msg: sys.exit(f"reproduce.py: {msg} (--help lists the settings)")  # one line, no usage block
    ap.add_argument("--mixer", default="gated_deltanet", help="the student's token mixer (swa: the sliding-window baseline)")
    ap.add_argument("--softmax_layers", default="", help="layers kept as softmax attention (a hybrid), e.g. 5,15,25")
    ap.add_argument("--window", type=int, default=SWA_WINDOW, help="keys seen by the swa student (default: "
                    "the linear students' state size)")
    ap.add_argument("--name", default="", help="the run's name (default: the mixer's; hybrid runs need one)")
    ap.add_argument("--teacher", action="store_true", help="evaluate the teacher alone: <results>/teacher.json")
    ap.add_argument("--tokens", type=tokens, default=tokens("100M"), help="distillation tokens, stages 1-3 together")
    ap.add_argument("--sft_tokens", type=tokens, default=None, help="SFT tokens (default: a tenth of --tokens, "
                    "at most one pass over data/sharegpt)")
    ap.add_argument("--mc_limit", type=int, default=1000, help="questions per task, evenly spaced (0 = all)")
    ap.add_argument("--tasks", default="lambada,arc_easy,arc_challenge,piqa,hellaswag,winogrande",
                    help="evaluate.py's tasks (the study's six)")
    ap.add_argument("--niah", default=None, help="niah.py's settings (default NIAH, to 4k; NIAH_LONG, to 8k, "
                    "with --long_context or --long_niah)")
    ap.add_argument("--long_context", type=int, default=0, help="stage 3's last --long_frac of steps at this "
                    "sequence length, tokens per step kept (train.py --long_block_size); the run is <name>_long<L>")
    ap.add_argument("--long_frac", type=float, default=None, help=f"with --long_context: the share of stage 3's "
                    f"steps at that length (default {LONG_FRAC}); with --long_niah, a baseline's: one more share "
                    f"whose long-context run may start from it (besides {', '.join(map(str, BRANCH_FRACS))})")
    ap.add_argument("--long_niah", action="store_true", help="NIAH to 8k (NIAH_LONG) without training anything new: "
                    "a baseline beside its long-context run (run whole, it also keeps stage 3's checkpoint at the "
                    "switch for that run to start from); with --teacher, teacher_long.json")
    ap.add_argument("--maturity", default="0.125,0.25,0.5", help="points inside stage 3, as fractions of --tokens "
                    "(distillation tokens, stages 1-3), where its weights are kept and lightly evaluated; '' for none")
    ap.add_argument("--maturity_tasks", default="lambada", help="evaluate.py's tasks at a maturity point")
    ap.add_argument("--maturity_niah", default=MATURITY_NIAH, help="niah.py's settings at a maturity point")
    ap.add_argument("--sft_kd", action="store_true", help="also run instruction-aware distillation (train.py "
                    "--stage=sft_kd) from the stage-3 student, and evaluate it beside SFT")
    ap.add_argument("--eval_extra", default="", help="evaluate.py settings added to each evaluation, e.g. '--max_windows=4'")
    ap.add_argument("--extra", default="", help="train.py settings added to every stage, e.g. '--batch_size=32'")
    ap.add_argument("--text", default=os.path.join("data", "modern"), help="the distillation corpus (stages 1-3)")
    ap.add_argument("--chat", default=os.path.join("data", "sharegpt"), help="the SFT corpus (ChatML, with masks)")
    ap.add_argument("--val", default=os.path.join("data", "modern", "val.bin"), help="held-out text for perplexity and KL")
    ap.add_argument("--work", default=os.path.join("out", "reproduce"), help="checkpoints and logs")
    ap.add_argument("--results", default=os.path.join("results", "study"), help="where <name>.json goes")
    ap.add_argument("--isolate", action="store_true", help="run each step as a process of its own (default: "
                    "in this one, so that start-up and compiled kernels are paid once a run)")
    ap.add_argument("--all", action="store_true", help="every run (the seven mixers, the hybrid, swa, the teacher), "
                    "one a GPU at a time")
    ap.add_argument("--runs", default=",".join(RUNS), help="with --all: which of them")
    args = ap.parse_args(argv)
    if args.long_context < 0:
        ap.error(f"--long_context={args.long_context}: expected a sequence length (0: off)")
    if args.long_frac is not None and not (args.long_context or args.long_niah):
        ap.error("--long_frac: a share of stage 3 at --long_context, which is not given")
    args.long_frac = LONG_FRAC if args.long_frac is None else args.long_frac
    if args.niah is None:
        args.niah = NIAH_LONG if args.long_context or args.long_niah else NIAH
    if args.mc_limit < 0:
        ap.error(f"--mc_limit={args.mc_limit}: expected 0 (all) or more")
    if args.all:
        runs = [r for r in args.runs.split(",") if r]
        if bad := [r for r in runs if r not in RUNS]:
            ap.error(f"--runs: {bad[0]!r} is not one of {', '.join(RUNS)}")
        if args.teacher or args.name or args.softmax_layers or any(a.startswith("--mixer") for a in argv):
            ap.error("--all sets each run's mixer, name and layers itself")
        check_inputs(args)
        check_settings(args)
        import torch

        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        gpus = [g for g in visible.split(",") if g] if visible else list(range(torch.cuda.device_count()))
        rest, skip = [], False
        for a in argv:  # every setting but --all and --runs (given as --runs=x or --runs x)
            if not skip and a != "--all" and not a.startswith("--runs"):
                rest.append(a)
            skip = a == "--runs"
        failed = run_all(rest, runs, gpus, args.work)
        if failed:
            sys.exit(f"reproduce.py: {', '.join(failed)} failed; their logs: {args.work}/<name>.out (the same "
                     f"command goes on from where each stopped)")
        print(f"all {len(runs)} runs done; their results: {args.results}")
        return
    if args.softmax_layers and not args.name:
        ap.error("--softmax_layers: a hybrid needs its own --name (its checkpoints and results go there)")
    name = run_name(args)
    if not re.fullmatch(r"[\w.-]+", name):
        ap.error(f"--name={name!r}: letters, digits, '.', '_' and '-' only")
    check_inputs(args)
    given = check_settings(args)

    import torch

    import distill
    import train

    py = sys.executable
    result = {"name": name, "commit": commit(), "machine": machine(), "date": time.strftime("%Y-%m-%d"),
              "command": " ".join(["python", "scripts/reproduce.py"] + [shlex.quote(a) for a in argv])}
    evals = {"val": args.val, "mc_limit": args.mc_limit, "tasks": args.tasks, "niah": args.niah,
             "eval_extra": args.eval_extra}  # recorded; a change reruns the evaluations alone
    t0 = time.time()
    out = os.path.join(args.results, name + ".json")
    if args.teacher:
        result["settings"] = evals
        pipe, ckpt = Pipeline(args.work, name, {}, args.isolate), {}
        pipe.after = lambda: write_results(out, result, pipe, args, ckpt, t0)
        pipe.after()  # what an earlier, cut run of these settings left
        measure(pipe, "teacher", "teacher", args, py)
    else:
        gpu = torch.cuda.is_available()
        d = {**(train.GPU_DEFAULTS if gpu else {}), **given}
        batch, block, accum = (d.get(k, getattr(train.Settings, k)) for k in ("batch_size", "block_size", "grad_accum"))
        per_step = batch * block * accum
        if "block_size" in given:  # the length asked for, in every stage
            sft_batch, sft_step = batch, per_step
        else:
            sft_batch = max(1, batch * block // SFT_LENGTH)
            sft_step = sft_batch * SFT_LENGTH * accum
        sft_tokens = args.sft_tokens or min(args.tokens // 10, os.path.getsize(os.path.join(ROOT, args.chat, "train.bin")) // 2)
        steps = {s: max(1, round(n / per_step)) for s, n in split(args.tokens).items()}
        steps["sft"] = max(1, round(sft_tokens / sft_step))
        if args.sft_kd:  # instruction-aware distillation: SFT's data and budget
            steps["sft_kd"] = steps["sft"]
        maturity = maturity_steps(args, steps, per_step)
        if args.long_context:  # train.py's own checks, before any step
            check_long(args, given, batch, block, steps["3"])
        result["settings"] = {"mixer": args.mixer, "softmax_layers": args.softmax_layers, "tokens": args.tokens,
                              "steps": steps, "tokens_per_step": per_step, "sft_tokens_per_step": sft_step,
                              "stage_tokens": {**{s: steps[s] * per_step for s in STAGES}, "sft": steps["sft"] * sft_step},
                              "maturity": maturity, "sft_kd": args.sft_kd,
                              "text": args.text, "chat": args.chat, "extra": args.extra}
        if args.mixer == "swa":
            result["settings"]["window"] = args.window
        if args.long_context:  # recorded only when set: a baseline's settings stay as they were
            result["settings"].update(long_context=args.long_context, long_frac=args.long_frac)
        pipe = Pipeline(args.work, name, dict(result["settings"]), args.isolate)
        result["settings"].update(evals)
        common = [f"--mixer={args.mixer}", f"--out_dir={pipe.dir}"] + (
            [f"--softmax_layers={args.softmax_layers}"] if args.softmax_layers else []) + (
            [f"--window={args.window}"] if args.mixer == "swa" else [])
        ckpt = {s: os.path.join(pipe.dir, args.mixer, f"stage{s}.pt") for s in (*STAGES, "sft", "sft_kd")}
        pipe.after = lambda: write_results(out, result, pipe, args, ckpt, t0)
        pipe.after()  # what an earlier, cut run of these settings left
        stage3_eval = os.path.join(pipe.dir, "stage3.eval.json")
        def switch(frac):  # the first long step of stage 3, where train.py switches
            return distill.long_start(steps["3"], frac)

        if args.long_context:
            branch(args, pipe, result["settings"], switch(args.long_frac))
        for s in steps:  # 1, 2, 3, sft and (--sft_kd) sft_kd, each sft from the stage-3 student
            chat = s.startswith("sft")
            cmd = [py, "train.py", f"--stage={s}", f"--max_iters={steps[s]}", "--resume=true",
                   f"--data_dir={args.chat if chat else args.text}"] + common
            if gpu and "compile" not in given:
                n = result["settings"]["stage_tokens"]["sft" if chat else s]
                cmd.append(f"--compile={str(n > COMPILE_TOKENS).lower()}")
            if chat and "block_size" not in given:
                cmd += [f"--block_size={SFT_LENGTH}", f"--batch_size={sft_batch}"]
            if s == "3":  # both given, even empty: a run started from a baseline's checkpoint keeps not its
                #   settings for these
                branches = sorted({switch(f) for f in {*BRANCH_FRACS, args.long_frac}} - {0}) if (
                    args.long_niah and not args.long_context) else []  # a baseline: where long runs may start
                cmd += [f"--keep_at={','.join(str(k) for k in maturity.values())}",
                        f"--branch_at={','.join(str(k) for k in branches)}"]
            if s == "3" and args.long_context:
                cmd += [f"--long_block_size={args.long_context}", f"--long_frac={args.long_frac}"]
            pipe.step(f"stage{s}", cmd + words("--extra", args.extra))
            if s == "3":
                measure(pipe, "stage3", ckpt["3"], args, py)
                for n, k in maturity.items():  # the kept weights inside stage 3, lightly
                    measure(pipe, f"mature{n}", ckpt["3"][:-3] + f"_step{k}.pt", args, py, stage3_eval)
            if chat:
                measure(pipe, s, ckpt[s], args, py, stage3_eval)
    write_results(out, result, pipe, args, ckpt, t0)
    print("\nwhere the run's time went (s):\n" + "\n".join(time_table(pipe.done)))
    print("\nthe same by part of the run:\n" + "\n".join(time_table(pipe.done, grouped=True)))
    print(f"wrote {out}")


def stop(*_):
    raise Stop


if __name__ == "__main__":
    try:
        main()
    except (Stop, KeyboardInterrupt):
        sys.exit("reproduce.py: stopped; the same command goes on from here")
