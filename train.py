"""
Train a linear-time student of a SmolLM2 teacher, one stage at a time, in one loop.

    python train.py --mixer=gated_deltanet --stage=1     # a few minutes on 2 CPU cores
    python train.py --mixer=gated_deltanet --stage=2     # starts from out/gated_deltanet/stage1.pt
    python train.py --mixer=gated_deltanet --stage=3     # starts from .../stage2.pt
    python train.py --mixer=gated_deltanet --stage=sft   # starts from .../stage3.pt; ChatML
    python train.py --mixer=gated_deltanet --stage=1 --teacher=HuggingFaceTB/SmolLM2-360M-Instruct
    python train.py --mixer=kda --stage=1 --softmax_layers=7,15,23   # a hybrid student
    torchrun --standalone --nproc_per_node=2 train.py --mixer=gated_deltanet --stage=3

distill.py says what each stage is. Every setting below is a --key=value (a bare --key means
true), stored whole in every checkpoint. A run writes <out_dir>/<mixer>/stage<N>.pt (atomically)
at every eval and at the end, with a plot of its losses beside it. Run the same command after a
crash and it continues with the losses of a run that never stopped: batches are a function of
(seed, step), and the checkpoint holds weights, optimizer, step and history (its settings,
updated by the command line). Several GPUs: torchrun (DistributedDataParallel; rank 0 logs,
evaluates and saves). Weights stay fp32 under bf16 autocast. MFU counts model FLOPs
(distill.flops_per_token) against peak_tflops. On a shared CPU, OMP_NUM_THREADS=1 steadies steps.

References:
1) karpathy/nanoGPT train.py: the shape of this loop (settings at the top, micro-steps,
   clipping, eval and checkpoint on the master process, one log line per step)
2) Hu et al. 2024, MiniCPM (warmup-stable-decay schedule)
"""

import argparse
import difflib
import math
import os
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, fields

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import checkpoint
import distill
from data import Data, need
import mixers
import model as M
from plots import plot

ROOT = os.path.dirname(os.path.abspath(__file__))  # the repository, home of data/


@dataclass
class Settings:
    # --- what to train ---
    mixer: str = "gated_deltanet"  # student token mixer: one of model.MIXERS ("attention": a copy of the teacher)
    stage: str = "1"  # "1", "2", "3", "sft" or "lm"; distill.py says what each is
    teacher: str = "default"  # anything checkpoint.load takes; 'default' = offline SmolLM2-135M-Instruct
    init_from: str = ""  # where the student starts; "" = the previous stage's checkpoint (stages 1, lm: the teacher)
    out_dir: str = "out"  # checkpoint <out_dir>/<mixer>/stage<N>.pt and its plot stage<N>.png
    resume: bool = True  # continue from this stage's own checkpoint when it exists; false starts over
    # --- a new student (stages 1, lm); later stages take the architecture from their checkpoint ---
    softmax_layers: str = ""  # layers kept as softmax attention, e.g. "7,15,23": a hybrid student
    window: int = 512  # keys seen by sliding-window attention (--mixer=swa)
    short_conv: bool = True  # the short causal conv on q, k, v, for every mixer alike
    # --- data ---
    data_dir: str = ""  # "" = data/modern (stages 1-3, lm); sft: data/smoltalk when prepared, else data/sharegpt
    block_size: int = 256  # tokens per sequence (the study: 512; its SFT: 1024)
    batch_size: int = 2  # sequences per micro-step, per GPU
    grad_accum: int = 1  # micro-steps per optimizer step
    # --- optimization ---
    max_iters: int = 40  # optimizer steps; 0 = the stage's token budget (distill.STAGES)
    learning_rate: float = 0.0  # peak lr; 0 = the stage's (1: 2e-4, 2: 2e-3, 3: 3e-4, sft: 3e-4)
    schedule: str = ""  # "wsd" (warmup, stable, linear decay) or "cosine"; "" = the stage's (sft: cosine)
    warmup_frac: float = 0.05  # first 5% of steps: linear warmup from 0
    decay_frac: float = 0.2  # wsd: the last 20% of steps decay linearly to the final lr
    min_lr_frac: float = 0.1  # final lr as a fraction of the peak, both schedules
    weight_decay: float = 0.1  # AdamW, on matrices only (not norms, biases, gate vectors)
    beta1: float = 0.9  # AdamW
    beta2: float = 0.95  # AdamW
    grad_clip: float = 1.0  # clip the global gradient norm; 0 = off
    # --- stage 3 loss: ce_weight * CE + kl_weight * KL(teacher || student), both per token ---
    ce_weight: float = 1.0  # the study: 1
    kl_weight: float = 1.0  # the study: 1
    temperature: float = 1.0  # softens both distributions in the KL (which is then scaled by T^2)
    # --- eval and logging ---
    eval_interval: int = 20  # steps between evals (each also writes the checkpoint)
    eval_iters: int = 2  # val batches per eval: the same fixed batches every time
    log_interval: int = 1  # steps between log lines (each one waits for the GPU)
    # --- system ---
    device: str = "cpu"  # torchrun picks cuda:<local rank> itself
    dtype: str = "float32"  # autocast dtype, "bfloat16" or "float32" (= no autocast); weights stay fp32.
    # fp32 on a CPU: without native bf16 (AVX2 alone) a bf16 product there runs some 40 times slower
    backend: str = ""  # the mixers' form: "naive", "torch" or "triton"; "" = triton on CUDA, torch otherwise
    compile: bool = False  # torch.compile the student with its loss, and the teacher's forward
    profile: int = 0  # > 0: profile this many steps after 3 warm-up steps, write <ckpt>_profile.txt/.json, stop
    seed: int = 1337  # new mixer weights and the order of batches
    peak_tflops: float = 0.0  # per device, for MFU; 0 = no MFU


# The defaults above are sized for 2 CPU cores. On a GPU these replace them, sized for one H200:
GPU_DEFAULTS = dict(
    block_size=512, batch_size=64, grad_accum=1,  # 64 * 512 = 32k tokens per step and GPU
    dtype="bfloat16",
    compile=True,  # the student with its loss, and the teacher's forward, through torch.compile
    max_iters=0,  # the stage's token budget
    eval_interval=250, eval_iters=20, log_interval=10,
    device="cuda", peak_tflops=989.0)  # H100/H200 dense bf16


def fail(msg):
    """Stop with a readable message and no traceback (the message goes to stderr, status 1)."""
    raise SystemExit(f"train.py: {msg}")


KINDS = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}


def parse_args(argv):
    """['--key=value', ...] -> {key: typed value}, only what argv gives; errors name the key and the type."""
    parser = argparse.ArgumentParser(prog="train.py", allow_abbrev=False, add_help=True)
    parser.error = fail  # one line, no usage block
    for f in fields(Settings):
        def typed(value, t=f.type, key=f.name):
            if t is bool and value.lower() in ("true", "1", "yes", "false", "0", "no"):
                return value.lower() in ("true", "1", "yes")
            try:
                if t is not bool:
                    return t(value)
            except ValueError:
                pass
            fail(f"--{key}={value!r}: expected {KINDS[t]}")
        bare = dict(nargs="?", const=True) if f.type is bool else {}  # a bare --key switches a bool on
        parser.add_argument(f"--{f.name}", type=typed, default=argparse.SUPPRESS, **bare)
    given, unknown = parser.parse_known_args(argv)
    if unknown:
        near = difflib.get_close_matches(unknown[0][2:].partition("=")[0], [f.name for f in fields(Settings)], n=1)
        fail(f"unknown setting {unknown[0]!r}{f' (did you mean --{near[0]}?)' if near else ''}; "
             f"settings are --key=value with key one of: {', '.join(f.name for f in fields(Settings))}")
    return vars(given)


def settings(argv):
    """The run's Settings, checked before any long work, and this stage's checkpoint when resuming."""
    given = parse_args(argv)
    on_gpu = torch.cuda.is_available() and not str(given.get("device", "cuda")).startswith("cpu")
    s = Settings(**{**(GPU_DEFAULTS if on_gpu else {}), **given})
    state = None  # this stage's own checkpoint (optimizer, step, history)
    if s.resume and os.path.exists(ckpt_path(s)):
        try:
            state = torch.load(ckpt_path(s), map_location="cpu", weights_only=True)
            state["settings"], state["step"]  # every checkpoint of this loop has both
        except Exception as e:
            fail(f"{ckpt_path(s)}: cannot resume from it ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
                 f"--resume=false starts this stage over")
        known = {f.name for f in fields(Settings)}  # a setting since removed is dropped
        s = Settings(**{**{k: v for k, v in state["settings"].items() if k in known}, **given})
    if s.stage not in distill.STAGES:
        fail(f"--stage={s.stage!r}: expected one of {', '.join(distill.STAGES)}")
    if s.dtype not in ("bfloat16", "float32"):
        fail(f"--dtype={s.dtype!r}: expected bfloat16 or float32")
    for check, key in ((M.check_mixer, "mixer"), (lambda b: mixers.check_backend(b or None, s.device), "backend")):
        try:
            check(getattr(s, key))
        except ValueError as e:
            fail(f"--{key}={getattr(s, key)!r}: {e}")
    try:
        M.check_softmax_layers(s.softmax_layers)
    except ValueError as e:
        fail(f"--softmax_layers={s.softmax_layers!r}: {e}")
    for key, ok, want in RANGES:
        if not ok(getattr(s, key)):
            fail(f"--{key}={getattr(s, key)!r}: expected {want}")
    try:
        checkpoint.check_device(s.device)
    except ValueError as e:
        fail(e)
    return s, state


# settings with a range: (key, test, what the error says is expected)
RANGES = [(k, lambda v: v >= 1, "an integer >= 1") for k in (
    "block_size", "batch_size", "grad_accum", "eval_interval", "eval_iters", "log_interval", "window")] + [
    (k, lambda v: v >= 0, "a number >= 0") for k in (
        "max_iters", "learning_rate", "weight_decay", "grad_clip", "ce_weight", "kl_weight", "profile", "peak_tflops")] + [
    (k, lambda v: 0 <= v <= 1, "a number from 0 to 1") for k in ("warmup_frac", "decay_frac", "min_lr_frac")] + [
    (k, lambda v: 0 <= v < 1, "a number from 0 to below 1") for k in ("beta1", "beta2")] + [
    ("temperature", lambda v: v > 0, "a number > 0")]


def resolve(s, tokens_per_step):
    """Fill in the settings whose default depends on the stage or the data ("" and 0 above)."""
    stage = distill.STAGES[s.stage]
    if not s.data_dir:  # the repository's corpora, wherever the command runs from
        data = os.path.join(ROOT, "data")
        chat = "smoltalk" if os.path.exists(os.path.join(data, "smoltalk", "train.bin")) else "sharegpt"
        s.data_dir = os.path.relpath(os.path.join(data, chat if stage["data"] == "chat" else "modern"))
    s.learning_rate = s.learning_rate or stage["lr"]
    s.schedule = s.schedule or stage["schedule"]
    if s.schedule not in ("wsd", "cosine"):
        fail(f"--schedule={s.schedule!r}: expected wsd or cosine")
    if s.max_iters <= 0:  # the study's tokens for this stage, or one epoch
        train_bin = os.path.join(s.data_dir, "train.bin")
        try:
            need(train_bin)
        except FileNotFoundError as e:
            fail(e)
        tokens = stage["tokens"] or os.path.getsize(train_bin) // 2
        s.max_iters = max(1, tokens // tokens_per_step)


def lr_at(step, s):
    """Learning rate of optimizer step `step` (0-based): linear warmup, then wsd or cosine.
    The last step runs at exactly min_lr_frac * learning_rate."""
    peak, floor, n = s.learning_rate, s.learning_rate * s.min_lr_frac, s.max_iters
    warmup = int(s.warmup_frac * n)
    if step < warmup:
        return peak * (step + 1) / warmup
    if s.schedule == "wsd":  # stable, then a linear decay over the last decay_frac of steps
        decay = max(1, int(s.decay_frac * n))
        left = n - step - 1  # steps after this one
        return peak if left >= decay else floor + (peak - floor) * left / decay
    progress = (step + 1 - warmup) / max(1, n - warmup)  # cosine from the peak to the floor
    return floor + (peak - floor) * 0.5 * (1 + math.cos(math.pi * progress))


# ---------------------------------------------------------------------------------------------
# Models and checkpoints


def ckpt_path(s, stage=None):
    return os.path.join(s.out_dir, s.mixer, f"stage{stage or s.stage}.pt")


def load(init_from, what):
    try:
        return checkpoint.load(init_from)
    except (FileNotFoundError, ValueError) as e:
        fail(f"{what}={init_from}: {e}")


def build_student(s, teacher, resuming):
    """The student this run starts from: its own checkpoint when resuming, --init_from, the
    previous stage's checkpoint, or (stages 1 and lm) a new one built from the teacher."""
    start = distill.STAGES[s.stage]["start"]
    if resuming:
        src = ckpt_path(s)
    elif s.init_from:
        src = s.init_from
    elif start == "teacher":
        torch.manual_seed(s.seed)  # the mixers' new weights
        try:
            hybrid = M.check_softmax_layers(s.softmax_layers, teacher.config.n_layer)
        except ValueError as e:
            fail(f"--softmax_layers={s.softmax_layers!r}: {e}")
        try:
            return checkpoint.student_from_teacher(teacher, s.mixer, softmax_layers=hybrid, window=s.window,
                                                   short_conv=s.short_conv)
        except ValueError as e:
            fail(f"--teacher={s.teacher}: {e}")
    else:
        src = ckpt_path(s, start)
        if not os.path.exists(src):
            extra = "".join(f" --{k}={getattr(s, k)}" for k in ("teacher", "out_dir")
                            if getattr(s, k) != getattr(Settings, k))
            fail(f"{src} not found: stage {s.stage} starts from stage {start}'s checkpoint; make it with\n"
                 f"  python train.py --mixer={s.mixer} --stage={start}{extra}\n"
                 f"or start elsewhere with --init_from=<checkpoint>")
    student = load(src, "--init_from")
    if student.config.mixer != s.mixer:
        fail(f"{src} holds a {student.config.mixer} student, not --mixer={s.mixer}")
    return student


def save(path, student, optimizer, step, s, history):
    """One checkpoint through checkpoint.save (written whole, then renamed)."""
    checkpoint.save(path, student, optimizer=optimizer.state_dict(), step=step, settings=asdict(s), history=history)


PROFILE_WARMUP = 3  # --profile: steps before the profiled ones (first calls, compiles, allocator)


def write_profile(prof, s, wall, base, cuda):
    """--profile's output: <base>_profile.txt (ops by self time on the device, or on the CPU) and
    <base>_profile.json (a Chrome trace for ui.perfetto.dev), and a line that sets wall time per
    step against the time the device was busy (far apart: the step waits on the host)."""
    ops, key = prof.key_averages(), "self_device_time_total" if cuda else "self_cpu_time_total"
    busy = sum(getattr(e, key) for e in ops if not e.key.startswith("ProfilerStep") and not e.is_user_annotation
               and (not cuda or e.device_type == torch.autograd.DeviceType.CUDA)) / 1e6 / s.profile  # s a step
    summary = (f"profile: {s.profile} steps after {PROFILE_WARMUP} warm-up, {wall * 1000:.1f} ms a step, "
               f"{'device' if cuda else 'CPU in ops'} busy {busy * 1000:.1f} ms a step ({busy / wall:.0%})")
    with open(base + "_profile.txt", "w") as f:
        f.write(summary + "\n\n" + ops.table(sort_by=key, row_limit=40) + "\n")
    prof.export_chrome_trace(base + "_profile.json")
    print(f"{summary}\nwrote {base}_profile.txt and {base}_profile.json", flush=True)


def count(n):
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.1f}k"


def clock(seconds):
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def distributed(s):
    """(ddp, rank, world size, device): under torchrun one process per GPU (or CPU processes, gloo)."""
    if "RANK" not in os.environ:
        return False, 0, 1, s.device
    dist.init_process_group("nccl" if s.device.startswith("cuda") else "gloo")
    device = f"cuda:{int(os.environ['LOCAL_RANK'])}" if s.device.startswith("cuda") else s.device
    if device.startswith("cuda"):
        torch.cuda.set_device(device)
    return True, dist.get_rank(), dist.get_world_size(), device


def adamw(params, s, fused):
    """AdamW over the (name, parameter) pairs that learn, with weight decay on matrices only."""
    groups = [{"params": [p for _, p in params if p.dim() >= 2], "weight_decay": s.weight_decay},
              {"params": [p for _, p in params if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=s.learning_rate, betas=(s.beta1, s.beta2), fused=fused)


# ---------------------------------------------------------------------------------------------
# The loop


def main(argv=None):
    """Train one stage; returns the loss history (a dict of lists, as stored in the checkpoint)."""
    s, state = settings(sys.argv[1:] if argv is None else argv)
    if state is not None and 0 < s.max_iters <= state["step"]:
        print(f"{ckpt_path(s)} is complete (step {state['step']} of {s.max_iters}); --resume=false starts over")
        return state["history"]

    ddp, rank, world, device = distributed(s)
    master = rank == 0
    log = print if master else (lambda *a, **k: None)
    tokens_per_step = s.batch_size * s.block_size * s.grad_accum * world
    chat = distill.STAGES[s.stage]["data"] == "chat"
    resolve(s, tokens_per_step)
    try:
        train_data, val_data = (Data(s.data_dir, split, s.block_size, chat) for split in ("train", "val"))
    except (FileNotFoundError, ValueError) as e:
        fail(e)
    if master:  # found now, not at the first checkpoint
        try:
            checkpoint.check_writable(os.path.dirname(ckpt_path(s)), f"--out_dir={s.out_dir}")
        except ValueError as e:
            fail(e)

    # the teacher (frozen) and the student
    teacher = load(s.teacher, "--teacher")
    if teacher.config.mixer != "attention" or teacher.config.softmax_layers:
        fail(f"--teacher={s.teacher} holds a {teacher.config.mixer} student, not a softmax-attention model; the "
             f"teacher is a GGUF, a snapshot, a hub id or a checkpoint of --mixer=attention")
    student = build_student(s, teacher, state is not None).set_backend(s.backend or None)
    for k in ("vocab_size", "n_layer", "n_embd"):
        if getattr(student.config, k) != getattr(teacher.config, k):
            fail(f"student and teacher differ in {k} ({getattr(student.config, k)} vs {getattr(teacher.config, k)})")
    for d in (train_data, val_data):
        if d.max_id >= student.config.vocab_size:
            fail(f"{d.path}: token id {d.max_id} is outside the model's vocabulary ({student.config.vocab_size})")
    ptdtype = getattr(torch, s.dtype)
    dev_type = "cuda" if "cuda" in device else "cpu"
    # the frozen teacher can live in bf16 on a GPU (half the memory, no casts under autocast)
    teacher = teacher.to(device=device, dtype=ptdtype if dev_type == "cuda" else torch.float32).eval()
    teacher.requires_grad_(False)
    student = student.to(device)  # fp32 master weights
    ctx = torch.autocast(dev_type, dtype=ptdtype) if s.dtype != "float32" else nullcontext()
    val_batches = val_data.fixed(s.eval_iters, s.batch_size, device)  # the same at every eval

    # what learns, the optimizer, the loss module
    params = distill.set_trainable(student, s.stage)
    optimizer = adamw(params, s, fused=dev_type == "cuda")
    loss_model = distill.StageLoss(student, s.stage, s.ce_weight, s.kl_weight, s.temperature, s.backend or None)
    # train_model is the same module, perhaps compiled and wrapped; evals use loss_model itself
    train_model = torch.compile(loss_model) if s.compile else loss_model
    teacher_pass = torch.compile(distill.teacher_pass) if s.compile else distill.teacher_pass  # frozen: forward only
    if ddp:
        train_model = DDP(train_model, device_ids=[torch.cuda.current_device()] if dev_type == "cuda" else None)
    step, history = 0, {"train": [], "val": []}
    if state is not None:
        optimizer.load_state_dict(state["optimizer"])
        step, history = state["step"], state["history"]
        log(f"resuming {ckpt_path(s)} at step {step}")
    state = None  # free the checkpoint's copy of the weights

    n_learn = sum(p.numel() for _, p in params)
    flops_tok = distill.flops_per_token(s.stage, student, teacher, s.block_size)
    log(f"stage {s.stage}, {s.mixer} student of {s.teacher}: {student.num_params() / 1e6:.1f}M parameters, "
        f"{n_learn / 1e6:.1f}M learn | {s.max_iters} steps of {tokens_per_step:,} tokens "
        f"({count(s.max_iters * tokens_per_step)}) | lr {s.learning_rate:g} {s.schedule} | "
        f"{world} x {device} {s.dtype} | data {s.data_dir}")

    # the first step whose loss or gradient norm is not finite, kept on the device (no sync a
    # step) and read where the loop waits for the device anyway: log lines, evals
    bad_step = torch.full((), -1, dtype=torch.long, device=device)
    saved_step, low, warned = (step or None), math.inf, False  # step > 0: resumed from that checkpoint

    def stop_if_diverged(loss_val=None):
        first = int(bad_step)
        if first < 0 and (loss_val is None or math.isfinite(loss_val)):
            return
        kept = f"{ckpt_path(s)} keeps the weights of step {saved_step}" if saved_step else "no checkpoint was written"
        fail(f"step {first + 1 if first >= 0 else step}: the loss or the gradient norm is not finite; stopped, and "
             f"{kept}. The learning rate ({s.learning_rate:g}) is likely too high: lower --learning_rate"
             f"{'' if s.grad_clip > 0 else ', or clip with --grad_clip=1'}")

    def eval_and_save():  # rank 0 only: eval, checkpoint, plot
        nonlocal saved_step
        stop_if_diverged()  # never a non-finite checkpoint over a finite one
        t0 = time.time()
        metrics = distill.evaluate(loss_model, teacher, val_batches, ctx)
        stop_if_diverged(metrics["loss"])
        history["val"].append({"step": step, **metrics})
        mem = f" | peak mem {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB" if dev_type == "cuda" else ""
        log(f"eval step {step}: val loss {metrics['loss']:.4f} | ppl {math.exp(metrics['ce']):.2f} "
            f"(teacher {math.exp(metrics['teacher_ce']):.2f}) | KL {metrics['kl']:.4f} | "
            f"top-1 agreement {metrics['top1']:.1%}{mem} | {time.time() - t0:.1f} s")
        if step > 0:  # step 0 is where the student starts: nothing to keep yet
            try:
                save(ckpt_path(s), student, optimizer, step, s, history)
            except OSError as e:
                fail(e)
            saved_step = step
        plot(history, ckpt_path(s)[:-3] + ".png")

    if master and step == 0 and not s.profile:
        eval_and_save()  # where the student starts
    if s.profile:  # a measurement: no eval, no checkpoint
        from torch.profiler import ProfilerActivity, profile, schedule

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev_type == "cuda" else [])
        prof = profile(activities=acts, schedule=schedule(wait=0, warmup=PROFILE_WARMUP, active=s.profile, repeat=1))
        s.max_iters, first, _ = max(s.max_iters, step + PROFILE_WARMUP + s.profile), step, prof.start()
    t_last, step_last, ema, lines = time.time(), step, None, 0
    while step < s.max_iters:
        # the learning rate is a function of the step alone (so resuming needs no schedule state)
        lr = lr_at(step, s)
        for group in optimizer.param_groups:
            group["lr"] = lr
        loss_sum = 0.0
        for micro in range(s.grad_accum):
            x, y = train_data.sample(s.batch_size, s.seed, step, micro * world + rank, device)
            # DDP averages gradients across GPUs only on the last micro-step
            sync = not ddp or micro == s.grad_accum - 1
            with nullcontext() if sync else train_model.no_sync():
                with ctx:
                    t_out = teacher_pass(teacher, x, s.stage)  # no_grad inside
                    loss, parts = train_model(x, y, t_out)
                (loss / s.grad_accum).backward()  # gradients add up over micro-steps: their mean
            loss_sum = loss_sum + parts["loss"] / s.grad_accum  # a device tensor: no sync here
        if s.grad_clip > 0:  # on the averaged gradient, after DDP's all-reduce
            norm = torch.nn.utils.clip_grad_norm_([p for _, p in params], s.grad_clip)
        else:
            grads = [p.grad for _, p in params if p.grad is not None]
            norm = torch.nn.utils.get_total_norm(grads) if grads else torch.zeros((), device=device)
        finite = torch.isfinite(norm).to(bad_step.device) & torch.isfinite(torch.as_tensor(loss_sum)).to(bad_step.device)
        bad_step = torch.where((bad_step < 0) & ~finite, step, bad_step)  # no sync: read at log lines and evals
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1

        if s.profile:
            if dev_type == "cuda":
                torch.cuda.synchronize()
            if step - first == PROFILE_WARMUP:
                t0 = time.time()
            if step - first < PROFILE_WARMUP + s.profile:
                prof.step()
                continue
            prof.stop()
            if master:
                os.makedirs(os.path.dirname(ckpt_path(s)), exist_ok=True)
                write_profile(prof, s, (time.time() - t0) / s.profile, ckpt_path(s)[:-3], dev_type == "cuda")
            break
        if step % s.log_interval == 0 or step == s.max_iters:
            loss_val = float(loss_sum)  # waits for the device
            if master:
                stop_if_diverged(loss_val)
            if not warned and loss_val > 10 * low:
                log(f"warning: the loss rose from {low:.4g} to {loss_val:.4g} by step {step}; the learning rate "
                    f"({lr:.2e} now) may be too high")
                warned = True
            low = min(low, loss_val)
            history["train"].append((step, loss_val))
            now = time.time()
            dt = (now - t_last) / (step - step_last)  # seconds per step since the last line
            t_last, step_last = now, step
            # smoothed, for the ETA; the first interval holds compilation and warm-up, so the
            # second one seeds it again
            ema = dt if lines < 2 else 0.9 * ema + 0.1 * dt
            lines += 1
            tok_s = tokens_per_step / dt  # all GPUs together
            mfu = f"{flops_tok * tok_s / (world * s.peak_tflops * 1e12):.1%}" if s.peak_tflops > 0 else "-"
            bar = "#" * (20 * step // s.max_iters)
            log(f"step {step}/{s.max_iters} [{bar:.<20}] loss {loss_val:.4f} | lr {lr:.2e} | "
                f"{tok_s:,.0f} tok/s | mfu {mfu} | {dt * 1000:.0f} ms | eta {clock(ema * (s.max_iters - step))}")
        if master and (step % s.eval_interval == 0 or step == s.max_iters):
            eval_and_save()
            t_last = time.time()  # eval time is not step time
    if ddp:  # every rank waits for rank 0's last eval and checkpoint: gloo can abort a rank that leaves first
        dist.barrier()
        dist.destroy_process_group()
    return history


if __name__ == "__main__":
    main()
