"""
Train a linear-time student of a SmolLM2 teacher, one stage at a time, in one loop.

    python train.py --mixer=gated_deltanet --stage=1     # a few minutes on 2 CPU cores
    python train.py --mixer=gated_deltanet --stage=2     # starts from out/gated_deltanet/stage1.pt
    python train.py --mixer=gated_deltanet --stage=3     # starts from .../stage2.pt
    python train.py --mixer=gated_deltanet --stage=sft   # starts from .../stage3.pt; ChatML
    python train.py --mixer=gated_deltanet --stage=1 --teacher=HuggingFaceTB/SmolLM2-360M-Instruct
    torchrun --standalone --nproc_per_node=2 train.py --mixer=gated_deltanet --stage=3

distill.py says what each stage is. Every setting in the block below can be given as
--key=value (a bare --key means true) and is stored whole in every checkpoint. A run writes
<out_dir>/<mixer>/stage<N>.pt (atomically) at every eval and at the end, and a plot of its
losses next to it. Run the same command again after a crash and it continues from there with
the same losses as a run that never stopped: the batches are a function of (seed, step), and
the checkpoint holds the weights, the optimizer, the step and the loss history. The settings of
a resumed run are the checkpoint's, updated by what the command line gives.

On a CPU that other jobs share, OMP_NUM_THREADS=1 trades some speed for steady step times
(torch's threads wait on each other when one of them is descheduled).

One GPU or CPU: python train.py ...; several GPUs: torchrun (DistributedDataParallel; rank 0
logs, evaluates and writes checkpoints). Weights stay fp32; the forward runs under bf16
autocast. MFU counts model FLOPs (distill.flops_per_token) against peak_tflops.

References:
1) karpathy/nanoGPT train.py: the shape of this loop (settings at the top, micro-steps,
   clipping, eval and checkpoint on the master process, one log line per step)
2) Hu et al. 2024, MiniCPM (warmup-stable-decay schedule)
"""

import math
import os
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, fields

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import distill
import mixers
import model as M

ROOT = os.path.dirname(os.path.abspath(__file__))  # the repository, home of data/
GPU = torch.cuda.is_available()  # the defaults below are sized for one H200 when True, 2 CPU cores otherwise


@dataclass
class Settings:
    # --- what to train ---
    mixer: str = "gated_deltanet"  # student token mixer: one of mixers.MIXERS, or "attention" (a copy of the teacher)
    stage: str = "1"  # "1", "2", "3", "sft" or "lm"; distill.py says what each is
    teacher: str = "default"  # anything model.from_pretrained takes; 'default' = offline SmolLM2-135M-Instruct
    init_from: str = ""  # where the student starts; "" = the previous stage's checkpoint (stages 1, lm: the teacher)
    out_dir: str = "out"  # checkpoint <out_dir>/<mixer>/stage<N>.pt and its plot stage<N>.png
    resume: bool = True  # continue from this stage's own checkpoint when it exists; false starts over
    # --- data ---
    data_dir: str = ""  # "" = data/offline (stages 1-3, lm); sft: data/smoltalk when prepared, else data/chat_offline
    block_size: int = 512 if GPU else 256  # tokens per sequence (the study: 512; its SFT: 1024)
    batch_size: int = 16 if GPU else 2  # sequences per micro-step, per GPU
    grad_accum: int = 4 if GPU else 1  # micro-steps per optimizer step: GPU 16*512*4 = 32k tokens per step and GPU
    # --- optimization ---
    max_iters: int = 0 if GPU else 40  # optimizer steps; 0 = the stage's token budget (distill.STAGES)
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
    eval_interval: int = 250 if GPU else 20  # steps between evals (each also writes the checkpoint)
    eval_iters: int = 20 if GPU else 2  # val batches per eval: the same fixed batches every time
    log_interval: int = 10 if GPU else 1  # steps between log lines (each one waits for the GPU)
    # --- system ---
    device: str = "cuda" if GPU else "cpu"  # torchrun picks cuda:<local rank> itself
    dtype: str = "bfloat16"  # autocast dtype, "bfloat16" or "float32" (= no autocast); weights stay fp32
    compile: bool = False  # torch.compile the student and its loss
    profile: int = 0  # > 0: profile this many steps after 3 warm-up steps, write <ckpt>_profile.txt/.json, stop
    seed: int = 1337  # new mixer weights and the order of batches
    peak_tflops: float = 989.0 if GPU else 0.0  # per device, for MFU (H100/H200 dense bf16); 0 = no MFU


def fail(msg):
    """Stop with a readable message and no traceback (the message goes to stderr, status 1)."""
    raise SystemExit(f"train.py: {msg}")


KINDS = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}


def parse_args(argv):
    """['--key=value', ...] -> {key: typed value}; every error names the key and its type."""
    types = {f.name: type(f.default) for f in fields(Settings)}
    given = {}
    for arg in argv:
        key, eq, value = arg[2:].partition("=")
        if not arg.startswith("--") or key not in types:
            import difflib

            near = difflib.get_close_matches(key, types, n=1)
            hint = f" (did you mean --{near[0]}?)" if near else ""
            fail(f"unknown setting {arg!r}{hint}; settings are --key=value with key one of: {', '.join(types)}")
        t = types[key]
        if not eq:  # a bare --key switches a bool on
            if t is not bool:
                fail(f"--{key} needs a value: --{key}=<{t.__name__}>")
            value = "true"
        try:
            if t is bool:
                if value.lower() not in ("true", "false", "1", "0", "yes", "no"):
                    raise ValueError
                given[key] = value.lower() in ("true", "1", "yes")
            else:
                given[key] = t(value)
        except ValueError:
            fail(f"--{key}={value!r}: expected {KINDS[t]}")
    return given


def resolve(s, tokens_per_step):
    """Fill in the settings whose default depends on the stage or the data ("" and 0 above)."""
    stage = distill.STAGES[s.stage]
    if not s.data_dir:  # the repository's corpora, wherever the command runs from
        data = os.path.join(ROOT, "data")
        chat = "smoltalk" if os.path.exists(os.path.join(data, "smoltalk", "train.bin")) else "chat_offline"
        s.data_dir = os.path.relpath(os.path.join(data, chat if stage["data"] == "chat" else "offline"))
    s.learning_rate = s.learning_rate or stage["lr"]
    s.schedule = s.schedule or stage["schedule"]
    if s.schedule not in ("wsd", "cosine"):
        fail(f"--schedule={s.schedule!r}: expected wsd or cosine")
    if s.max_iters <= 0:  # the study's tokens for this stage, or one epoch
        train_bin = os.path.join(s.data_dir, "train.bin")
        need(train_bin)
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
# Data: nanoGPT's uint16 token files (data/README.md), and uint8 loss masks for chat corpora


def need(path):
    """Stop with the command that builds a missing data file."""
    if not os.path.exists(path):
        prep = os.path.join(os.path.dirname(path), "prepare.py")
        how = f"build it with: python {os.path.relpath(prep)}" if os.path.exists(prep) else \
            "expected uint16 token files train.bin and val.bin (chat: and uint8 train_mask.bin, val_mask.bin)"
        fail(f"{path} not found; {how}")


class Data:
    """Windows of block_size + 1 tokens from <data_dir>/<split>.bin.

    Text windows start anywhere; chat windows start at a conversation (after an
    <|endoftext|>, id 0) and their targets are -1 (no loss) wherever <split>_mask.bin is 0.
    """

    def __init__(self, data_dir, split, block_size, chat):
        self.path, self.T, self.chat = os.path.join(data_dir, f"{split}.bin"), block_size, chat
        self.mask_path = os.path.join(data_dir, f"{split}_mask.bin")
        for p in [self.path] + ([self.mask_path] if chat else []):
            need(p)
        tokens = np.memmap(self.path, dtype=np.uint16, mode="r")
        if len(tokens) <= block_size + 1:
            fail(f"{self.path}: {len(tokens)} tokens, fewer than one window of --block_size={block_size}")
        self.max_id = int(tokens.max())  # checked against the vocabulary once the model is loaded
        last = len(tokens) - block_size - 1  # the last position a window may start at
        self.starts = None  # text: window i starts at token i, for i in [0, n)
        self.n = last + 1
        if chat:  # window i starts at conversation i, of those that leave room for a whole window
            starts = np.concatenate([[0], np.flatnonzero(np.asarray(tokens) == 0) + 1])
            self.starts = starts[starts <= last]
            self.n = len(self.starts)

    def get(self, ix, device):
        """x, y [len(ix), T] int64: windows number ix (see __init__), inputs and next tokens."""
        tokens = np.memmap(self.path, dtype=np.uint16, mode="r")  # reopened each time (nanoGPT: avoids a leak)
        pos = ix if self.starts is None else self.starts[ix]
        x = torch.from_numpy(np.stack([tokens[i:i + self.T] for i in pos]).astype(np.int64))  # (B, T)
        y = torch.from_numpy(np.stack([tokens[i + 1:i + 1 + self.T] for i in pos]).astype(np.int64))
        if self.chat:  # loss only where the mask says so (the assistant's tokens)
            mask = np.memmap(self.mask_path, dtype=np.uint8, mode="r")
            keep = torch.from_numpy(np.stack([mask[i + 1:i + 1 + self.T] for i in pos]).astype(bool))
            y = y.masked_fill(~keep, -1)
        return x.to(device), y.to(device)

    def sample(self, B, seed, step, part, device):
        """Part `part` of step `step`'s batch (part = micro-step * GPUs + rank): a pure function
        of its coordinates, so a resumed run draws exactly the batches the interrupted one would
        have, and a step's batch is the same however it is split over GPUs and micro-steps."""
        rng = np.random.default_rng([seed, step, part])
        return self.get(rng.integers(0, self.n, size=B), device)

    def fixed(self, n, B, device):
        """n batches of evenly spaced windows: the same val set at every eval."""
        ix = np.linspace(0, self.n - 1, n * B).astype(np.int64)
        return [self.get(ix[i * B:(i + 1) * B], device) for i in range(n)]


# ---------------------------------------------------------------------------------------------
# Models and checkpoints


def ckpt_path(s, stage=None):
    return os.path.join(s.out_dir, s.mixer, f"stage{stage or s.stage}.pt")


def load(init_from, what):
    try:
        return M.from_pretrained(init_from)
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
        return mixers.student_from_teacher(teacher, s.mixer)
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
    """One checkpoint through model.save_checkpoint (written whole, then renamed)."""
    M.save_checkpoint(path, student, optimizer=optimizer.state_dict(), step=step,
                      settings=asdict(s), history=history)


def plot(history, path):
    """The loss curves as a PNG (train and val loss; val KL and top-1 agreement)."""
    try:
        import matplotlib

        matplotlib.use("Agg")  # no display needed
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    if history["train"]:
        a.plot(*zip(*history["train"]), label="train", lw=0.8)
    val = history["val"]
    if val:
        a.plot([v["step"] for v in val], [v["loss"] for v in val], "o-", label="val")
        b.plot([v["step"] for v in val], [v["kl"] for v in val], "o-", color="C2", label="KL(teacher || student)")
        b2 = b.twinx()
        b2.plot([v["step"] for v in val], [v["top1"] for v in val], "s--", color="C3", label="top-1 agreement")
        b2.set_ylabel("top-1 agreement")
        b2.legend(loc="upper right")
    name = os.path.basename(os.path.dirname(os.path.abspath(path))) + ", " + os.path.basename(path)[:-4]
    a.set(xlabel="step", ylabel="stage loss", yscale="log", title=name.replace("stage", "stage "))
    b.set(xlabel="step", ylabel="val KL per token", title="student vs teacher (val)")
    a.legend()
    b.legend(loc="upper left")
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path + ".tmp", format="png", dpi=90)
    plt.close(fig)
    os.replace(path + ".tmp", path)


class Profile:
    """--profile=N: torch.profiler over N steps after 3 warm-up steps. Writes <base>_profile.txt
    (ops by self time on the device, or on the CPU without one) and <base>_profile.json (a
    Chrome trace for chrome://tracing or ui.perfetto.dev), and logs wall time per step against
    the time the device was busy: far apart, the step waits on Python and kernel launches."""

    WARMUP = 3

    def __init__(self, s, dev_type, step):
        from torch.profiler import ProfilerActivity, profile, schedule

        self.n, self.cuda, self.first = s.profile, dev_type == "cuda", step
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
        self.prof = profile(activities=acts, schedule=schedule(wait=0, warmup=self.WARMUP, active=self.n, repeat=1))
        self.prof.start()
        self.t0 = None

    def step(self, step, master, base):
        """Call after each optimizer step; True once the profiled steps are done."""
        if self.cuda:
            torch.cuda.synchronize()
        done = step - self.first
        if done == self.WARMUP:
            self.t0 = time.time()
        if done < self.WARMUP + self.n:
            self.prof.step()
            return False
        wall = (time.time() - self.t0) / self.n
        self.prof.stop()
        if master:
            ops = self.prof.key_averages()
            if self.cuda:  # the kernels (and copies) themselves: ops carry their kernels' time too
                key = "self_device_time_total"
                # (not the step markers, which the profiler also puts on the device's timeline)
                busy = sum(e.self_device_time_total for e in ops if e.device_type == torch.autograd.DeviceType.CUDA
                           and not e.is_user_annotation and not e.key.startswith("ProfilerStep"))
            else:  # ops' own time; ProfilerStep's own time is the Python between ops
                key = "self_cpu_time_total"
                busy = sum(e.self_cpu_time_total for e in ops if not e.key.startswith("ProfilerStep"))
            busy = busy / 1e6 / self.n  # seconds a step (the totals are in us)
            where = "device" if self.cuda else "CPU in ops (the Python between ops left out)"
            summary = (f"profile: {self.n} steps after {self.WARMUP} warm-up, {wall * 1000:.1f} ms a step, "
                       f"{where} busy {busy * 1000:.1f} ms a step ({busy / wall:.0%})")
            os.makedirs(os.path.dirname(base) or ".", exist_ok=True)
            with open(base + "_profile.txt", "w") as f:
                f.write(summary + "\n\n" + ops.table(sort_by=key, row_limit=40) + "\n")
            self.prof.export_chrome_trace(base + "_profile.json")
            print(f"{summary}\nwrote {base}_profile.txt and {base}_profile.json", flush=True)
        return True


@torch.no_grad()
def evaluate(loss_model, teacher, batches, ctx):
    """The stage loss, and the student against the teacher, over the fixed val batches."""
    totals = {}
    for x, y in batches:
        with ctx:
            t_out = distill.teacher_pass(teacher, x, loss_model.stage, logits=True)
            _, parts = loss_model(x, y, t_out)
            metrics = distill.compare(loss_model.student(x), t_out["logits"], y)
        metrics["loss"] = parts["loss"].item()
        for k, v in metrics.items():
            totals[k] = totals.get(k, 0.0) + v / len(batches)
    return totals


def count(n):
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.1f}k"


def clock(seconds):
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


# ---------------------------------------------------------------------------------------------
# The loop


def main(argv=None):
    """Train one stage; returns the loss history (a dict of lists, as stored in the checkpoint)."""
    given = parse_args(sys.argv[1:] if argv is None else argv)  # only what the command line says
    s = Settings(**given)  # ... on top of the defaults
    if s.stage not in distill.STAGES:
        fail(f"--stage={s.stage!r}: expected one of {', '.join(distill.STAGES)}")
    if s.mixer not in mixers.MIXERS + ("attention",):
        fail(f"--mixer={s.mixer!r}: expected one of {', '.join(mixers.MIXERS)}, or attention")
    if s.dtype not in ("bfloat16", "float32"):
        fail(f"--dtype={s.dtype!r}: expected bfloat16 or float32")
    state = None  # this stage's own checkpoint, when resuming
    if s.resume and os.path.exists(ckpt_path(s)):
        state = torch.load(ckpt_path(s), map_location="cpu", weights_only=True)  # optimizer, step, history
        known = {f.name for f in fields(Settings)}  # a setting since removed is dropped
        s = Settings(**{**{k: v for k, v in state["settings"].items() if k in known}, **given})
        if 0 < s.max_iters <= state["step"]:
            print(f"{ckpt_path(s)} is complete (step {state['step']} of {s.max_iters}); --resume=false starts over")
            return state["history"]

    ddp = "RANK" in os.environ  # launched by torchrun: one process per GPU (or CPU processes, gloo)
    if ddp:
        dist.init_process_group("nccl" if s.device.startswith("cuda") else "gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
        device = f"cuda:{int(os.environ['LOCAL_RANK'])}" if s.device.startswith("cuda") else s.device
        if device.startswith("cuda"):
            torch.cuda.set_device(device)
    else:
        rank, world, device = 0, 1, s.device
    master = rank == 0
    log = print if master else (lambda *a, **k: None)
    tokens_per_step = s.batch_size * s.block_size * s.grad_accum * world
    chat = distill.STAGES[s.stage]["data"] == "chat"
    resolve(s, tokens_per_step)

    train_data = Data(s.data_dir, "train", s.block_size, chat)
    val_data = Data(s.data_dir, "val", s.block_size, chat)

    # the teacher (frozen) and the student
    teacher = load(s.teacher, "--teacher")
    student = build_student(s, teacher, state is not None)
    for k in ("vocab_size", "n_layer", "n_embd"):
        if getattr(student.config, k) != getattr(teacher.config, k):
            fail(f"student and teacher differ in {k} ({getattr(student.config, k)} vs {getattr(teacher.config, k)})")
    ptdtype = getattr(torch, s.dtype)
    dev_type = "cuda" if "cuda" in device else "cpu"
    # the frozen teacher can live in bf16 on a GPU (half the memory, no casts under autocast)
    teacher = teacher.to(device=device, dtype=ptdtype if dev_type == "cuda" else torch.float32).eval()
    teacher.requires_grad_(False)
    student = student.to(device)  # fp32 master weights
    ctx = torch.autocast(dev_type, dtype=ptdtype) if s.dtype != "float32" else nullcontext()

    for d in (train_data, val_data):
        if d.max_id >= student.config.vocab_size:
            fail(f"{d.path}: token id {d.max_id} is outside the model's vocabulary ({student.config.vocab_size})")
    val_batches = val_data.fixed(s.eval_iters, s.batch_size, device)  # the same at every eval

    # what learns, the optimizer (decay on matrices only), the loss module
    params = distill.set_trainable(student, s.stage)
    groups = [{"params": [p for _, p in params if p.dim() >= 2], "weight_decay": s.weight_decay},
              {"params": [p for _, p in params if p.dim() < 2], "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=s.learning_rate, betas=(s.beta1, s.beta2),
                                  fused=dev_type == "cuda")
    loss_model = distill.StageLoss(student, s.stage, s.ce_weight, s.kl_weight, s.temperature)
    # train_model is the same module, perhaps compiled and wrapped; evals use loss_model itself
    train_model = torch.compile(loss_model) if s.compile else loss_model
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

    def eval_and_save():  # rank 0 only: eval, checkpoint, plot
        t0 = time.time()
        metrics = evaluate(loss_model, teacher, val_batches, ctx)
        history["val"].append({"step": step, **metrics})
        mem = f" | peak mem {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB" if dev_type == "cuda" else ""
        log(f"eval step {step}: val loss {metrics['loss']:.4f} | ppl {math.exp(metrics['ce']):.2f} "
            f"(teacher {math.exp(metrics['teacher_ce']):.2f}) | KL {metrics['kl']:.4f} | "
            f"top-1 agreement {metrics['top1']:.1%}{mem} | {time.time() - t0:.1f} s")
        if step > 0:  # step 0 is where the student starts: nothing to keep yet
            save(ckpt_path(s), student, optimizer, step, s, history)
        plot(history, ckpt_path(s)[:-3] + ".png")

    if master and step == 0 and not s.profile:
        eval_and_save()  # where the student starts
    prof = None
    if s.profile:
        s.max_iters = max(s.max_iters, step + Profile.WARMUP + s.profile)
        prof = Profile(s, dev_type, step)
    t_last, step_last, ema = time.time(), step, None
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
                    t_out = distill.teacher_pass(teacher, x, s.stage)  # no_grad inside
                    loss, parts = train_model(x, y, t_out)
                (loss / s.grad_accum).backward()  # gradients add up over micro-steps: their mean
            loss_sum = loss_sum + parts["loss"] / s.grad_accum  # a device tensor: no sync here
        if s.grad_clip > 0:  # on the averaged gradient, after DDP's all-reduce
            torch.nn.utils.clip_grad_norm_([p for _, p in params], s.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        if prof is not None and prof.step(step, master, ckpt_path(s)[:-3]):
            break  # profiling is a measurement: no eval, no checkpoint

        if step % s.log_interval == 0 or step == s.max_iters:
            loss_val = float(loss_sum)  # waits for the device
            history["train"].append((step, loss_val))
            now = time.time()
            dt = (now - t_last) / (step - step_last)  # seconds per step since the last line
            t_last, step_last = now, step
            ema = dt if ema is None else 0.9 * ema + 0.1 * dt  # smoothed, for the ETA
            tok_s = tokens_per_step / dt  # all GPUs together
            mfu = f"{flops_tok * tok_s / (world * s.peak_tflops * 1e12):.1%}" if s.peak_tflops > 0 else "-"
            bar = "#" * (20 * step // s.max_iters)
            log(f"step {step}/{s.max_iters} [{bar:.<20}] loss {loss_val:.4f} | lr {lr:.2e} | "
                f"{tok_s:,.0f} tok/s | mfu {mfu} | {dt * 1000:.0f} ms | eta {clock(ema * (s.max_iters - step))}")
        if master and not s.profile and (step % s.eval_interval == 0 or step == s.max_iters):
            eval_and_save()
            t_last = time.time()  # eval time is not step time
    if ddp:
        dist.destroy_process_group()
    return history


if __name__ == "__main__":
    main()
