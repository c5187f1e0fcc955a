"""
Train a linear-time student of a SmolLM2 teacher, one stage at a time, in one loop.

    python train.py --mixer=gated_deltanet --stage=1     # a few minutes on 2 CPU cores
    python train.py --mixer=gated_deltanet --stage=2     # starts from out/gated_deltanet/stage1.pt
    python train.py --mixer=gated_deltanet --stage=3     # then sft (or sft_kd): ChatML chats
    python train.py --mixer=kda --stage=1 --softmax_layers=5,15,25   # a hybrid student
    torchrun --standalone --nproc_per_node=2 train.py --mixer=gated_deltanet --stage=3

distill.py says what each stage is; distill.STAGES holds each stage's defaults. Every setting
below is a --key=value (--help lists them); a run prints its effective settings first and stores
them in every checkpoint, <out_dir>/<mixer>/stage<N>.pt, written whole at every eval. The same
command after a crash goes on with the losses of a run that never stopped: batches are a
function of (seed, step). --teacher is the softmax teacher; --init_from is where the student
starts: "teacher" (a new student with --mixer, built from the teacher) or a checkpoint (by
default after stage 1 the previous stage's), which must hold --mixer. sample.py, niah.py and
evaluate.py read the three the same way.

References: 1) karpathy/nanoGPT train.py, the shape of this loop; 2) Hu et al. 2024, MiniCPM, the
warmup-stable-decay schedule.
"""

import copy
import functools
import math
import os
import sys
import time
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import checkpoint
import cli
import distill
from data import Data
import mixers
import model as M
from plots import plot


@dataclass
class Settings:
    # --- set by the stage (distill.STAGES and the machine, below) unless given ---
    learning_rate: float  # peak learning rate
    schedule: str  # "wsd" (warmup, stable, linear decay) or "cosine"
    data_dir: str  # train.bin and val.bin (chat: with their masks): data/modern, data/smoltalk
    #   or data/sharegpt
    init_from: str  # where the student starts: "teacher" (a new student built from --teacher)
    #   or a checkpoint
    max_iters: int  # optimizer steps: 40 on a CPU; on a GPU the stage's token budget (sft,
    #   sft_kd: one epoch)
    # --- what to train ---
    mixer: str = "gated_deltanet"  # the student's token mixer: one of model.MIXERS ("attention":
    #   a copy of the teacher); a checkpoint to start from must hold it
    stage: str = "1"  # "1", "2", "3", "sft", "sft_kd" or "lm"; distill.py says what each is
    teacher: str = "default"  # the softmax teacher, anything checkpoint.load takes; 'default' =
    #   offline SmolLM2-135M-Instruct
    out_dir: str = "out"  # checkpoint <out_dir>/<mixer>/stage<N>.pt and its plot stage<N>.png
    resume: bool = True  # continue from this stage's own checkpoint when it exists; false
    #   starts over
    # --- a new student (init_from=teacher); later stages take it from their checkpoint ---
    softmax_layers: str = ""  # layers kept as softmax attention, e.g. "5,15,25": a hybrid student
    window: int = 512  # keys seen by sliding-window attention (--mixer=swa)
    short_conv: bool = True  # the short causal conv on q, k, v, for every mixer alike
    # --- data ---
    block_size: int = 256  # tokens per sequence (the study: 512; its SFT: 1024)
    batch_size: int = 2  # sequences per micro-step, per GPU
    grad_accum: int = 1  # micro-steps per optimizer step
    long_block_size: int = 0  # 0: off; else the length of the last long_frac of steps (text stages)
    long_frac: float = 0.25  # that share of steps; batch_size shrinks to keep tokens/step the same
    # --- optimization ---
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
    keep_at: str = ""  # steps, e.g. "1000,2000", whose weights are also kept as
    #   stage<N>_step<M>.pt (and evaluated)
    branch_at: str = ""  # steps whose whole checkpoint (optimizer, step, history) is also kept as
    #   stage<N>_branch<M>.pt, for a run that goes on from there otherwise (a long-context run)
    eval_iters: int = 2  # val batches per eval: the same fixed batches every time
    log_interval: int = 1  # steps between log lines (each one waits for the GPU)
    # --- system ---
    device: str = "cpu"  # torchrun picks cuda:<local rank> itself
    dtype: str = "float32"  # autocast dtype, "bfloat16" or "float32" = none (on a CPU without
    #   bf16, bf16 is 40x slower)
    backend: str = "torch"  # the mixers' backend: "naive", "torch" or "triton" (mixers.py)
    compile: bool = False  # torch.compile the student with its loss, and the teacher's forward
    compile_blocks: bool = False  # with compile: compile a block's code once for every layer
    #   (the student's blocks, the teacher's), not the whole step: less compiling, fewer fusions
    teacher_ahead: bool = False  # issue the next micro-step's teacher pass before this one's
    #   backward (on a GPU on a stream of its own, beside it): the same numbers
    cuda_graph: bool = False  # one GPU: capture the step once as a CUDA graph and replay it, the
    #   host issuing a step as one launch (the teacher's pass then in line: no --teacher_ahead)
    seed: int = 1337  # new mixer weights and the order of batches
    peak_tflops: float = 0.0  # per device, for MFU; 0 = no MFU


CPU_ITERS = 40  # a CPU run's length: a few minutes, enough to watch every loss fall
# The defaults above are sized for 2 CPU cores. On a GPU these replace them, sized for one H200:
GPU_DEFAULTS = dict(
    block_size=512, batch_size=64, grad_accum=1,  # 64 * 512 = 32k tokens per step and GPU
    dtype="bfloat16", backend="triton",
    compile=True,  # the student with its loss, and the teacher's forward, through torch.compile
    compile_blocks=True,  # one block at a time: the step as fast as whole (175k against 176k
    #   tokens/s at stage 3 on an H200), its compiling about 34 s, not about 100
    # an eval and a checkpoint (1.9 GB at stage 3, seconds to write) every 500 steps: about
    # 100 s of an H200's training, which a kill can lose
    eval_interval=500, eval_iters=20, log_interval=10,
    teacher_ahead=True,  # stage 3 2.4 to 10.4% faster in 4 pairs of runs on H100s; 1 and 2 in noise
    device="cuda", peak_tflops=989.0)  # H100/H200 dense bf16


def fail(msg):
    """Stop with a readable message and no traceback (the message goes to stderr, status 1)."""
    raise SystemExit(f"train.py: {msg}")


@contextmanager
def stops(what="", errors=(FileNotFoundError, ValueError)):
    """Turns an error of these kinds inside the block into fail's one line, after `what`."""
    try:
        yield
    except errors as e:
        fail(f"{what}: {e}" if what else e)


# ---------------------------------------------------------------------------------------------
# Settings: the command line, the stage's defaults, checks before any long work


def settings(argv):
    """The run's Settings, checked before any long work, and this stage's checkpoint when
    resuming."""
    given = cli.parse(argv, Settings, fail, GPU_DEFAULTS)
    on_gpu = cli.on_gpu(given)
    d = {**cli.defaults(Settings), **(GPU_DEFAULTS if on_gpu else {}), **given}
    if d["stage"] not in distill.STAGES:
        fail(f"--stage={d['stage']!r}: expected one of {', '.join(distill.STAGES)}")
    stage_defaults = distill.defaults(d["stage"], d["mixer"], d["out_dir"])
    s = Settings(**{**stage_defaults, "max_iters": CPU_ITERS, **d})
    if on_gpu and "max_iters" not in given:  # the stage's token budget
        world = int(os.environ.get("WORLD_SIZE", 1))
        with stops():
            s.max_iters = distill.steps(s.stage, s.data_dir,
                                        s.batch_size * s.block_size * s.grad_accum * world)
    state = None  # this stage's own checkpoint (optimizer, step, history)
    if s.resume and os.path.exists(ckpt_path(s)):
        try:
            state = torch.load(ckpt_path(s), map_location="cpu", weights_only=True)
            state["settings"], state["step"]  # every checkpoint of this loop has both
        except Exception as e:
            first = str(e).splitlines()[0] if str(e) else ""
            fail(f"{ckpt_path(s)}: cannot resume from it ({type(e).__name__}: {first}); "
                 f"--resume=false starts this stage over")
        # the checkpoint's settings, less any since removed and the "" that older ones stored for
        # a default
        stored = {k: v for k, v in state["settings"].items() if k in asdict(s) and v != ""}
        s = Settings(**{**asdict(s), **stored, **given})
    check(s)
    start = distill.STAGES[s.stage]["start"]
    missing = s.init_from == ckpt_path(s, start) and not os.path.exists(s.init_from)  # not made yet
    if state is None and missing:
        extra = "".join(f" --{k}={getattr(s, k)}" for k in ("teacher", "out_dir")
                        if getattr(s, k) != getattr(Settings, k))
        fail(f"{s.init_from} not found: stage {s.stage} starts from stage {start}'s checkpoint; "
             f"make it with\n"
             f"  python train.py --mixer={s.mixer} --stage={start}{extra}\n"
             f"or start elsewhere with --init_from=<checkpoint>")
    return s, state


# settings with a range or a form: (key, test, what the error says is expected)
RANGES = [
    ("dtype", lambda v: v in ("bfloat16", "float32"), "bfloat16 or float32"),
    ("schedule", lambda v: v in ("wsd", "cosine"), "wsd or cosine")] + [
    (k, lambda v: all(n.isdigit() for n in v.split(",")) if v else True,
     "step numbers such as 1000,2000") for k in ("keep_at", "branch_at")] + [
    (k, lambda v: v >= 1, "an integer >= 1") for k in (
        "block_size", "batch_size", "grad_accum", "eval_interval", "eval_iters", "log_interval",
        "window", "max_iters")] + [
    (k, lambda v: v >= 0, "a number >= 0") for k in (
        "learning_rate", "weight_decay", "grad_clip", "ce_weight", "kl_weight", "peak_tflops")] + [
    (k, lambda v: 0 <= v <= 1, "a number from 0 to 1")
    for k in ("warmup_frac", "decay_frac", "min_lr_frac")] + [
    (k, lambda v: 0 <= v < 1, "a number from 0 to below 1") for k in ("beta1", "beta2")] + [
    ("temperature", lambda v: v > 0, "a number > 0")]


def check(s):
    """A one-line failure for the first setting that cannot work."""
    cli.check(s, RANGES, fail)
    for key, test in (("mixer", M.check_mixer),
                      ("backend", lambda b: mixers.check_backend(b, s.device)),
                      ("softmax_layers", cli.check_softmax_layers)):
        with stops(f"--{key}={getattr(s, key)!r}"):
            test(getattr(s, key))
    with stops():
        checkpoint.check_device(s.device)
        distill.check_long(s)  # and against the teacher's context once it loads
    if s.cuda_graph:
        if not s.device.startswith("cuda"):
            fail(f"--cuda_graph captures the step on a GPU; --device={s.device} has none")
        if "RANK" in os.environ:
            fail("--cuda_graph runs on one GPU: run train.py without torchrun")
        if s.backend != "triton":  # e.g. the torch backend's masked KL counts rows on the host
            fail(f"--cuda_graph needs --backend=triton: --backend={s.backend} waits on the GPU")
        if os.environ.get("TORCHINDUCTOR_CUDAGRAPHS") == "1":
            fail("--cuda_graph captures the whole step: unset TORCHINDUCTOR_CUDAGRAPHS")
    if s.init_from == "default":
        fail("--init_from=default: the offline teacher is --teacher=default, and "
             "--init_from=teacher builds a new student from it; --init_from=<checkpoint> starts "
             "elsewhere")


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
# Models, data and checkpoints


def ckpt_path(s, stage=None):
    return os.path.join(s.out_dir, s.mixer, f"stage{stage or s.stage}.pt")


def branch_path(s, step):
    """Where --branch_at keeps the whole checkpoint of a step."""
    return f"{ckpt_path(s)[:-3]}_branch{step}.pt"


def build_student(s, teacher, resuming):
    """The student this run starts from: its own checkpoint when resuming, else --init_from: a
    checkpoint, or "teacher" for a new student built from the teacher."""
    if not resuming and s.init_from == "teacher":
        torch.manual_seed(s.seed)  # the mixers' new weights
        with stops(f"--softmax_layers={s.softmax_layers!r}"):
            hybrid = cli.check_softmax_layers(s.softmax_layers, teacher.config.n_layer)
        with stops(f"--teacher={s.teacher}"):
            return checkpoint.student_from_teacher(teacher, s.mixer, softmax_layers=hybrid,
                                                   window=s.window, short_conv=s.short_conv)
    src = ckpt_path(s) if resuming else s.init_from
    with stops(f"--init_from={src}"):
        student = checkpoint.load(src)
    if student.config.mixer != s.mixer:
        fail(f"{src} holds a {student.config.mixer} student, not --mixer={s.mixer}")
    return student


def models_and_data(s, resuming, device, master):
    """The frozen teacher (in the autocast dtype on a GPU: half the memory, no casts) and the
    student (fp32) on the device, and the stage's train and val corpora, all checked against each
    other; the output folder is checked now too, not at the first checkpoint."""
    with stops():
        corpora = [Data(s.data_dir, split, s.block_size, distill.STAGES[s.stage]["data"] == "chat")
                   for split in ("train", "val")]
        if master:
            checkpoint.check_writable(os.path.dirname(ckpt_path(s)), f"--out_dir={s.out_dir}")
    with stops(f"--teacher={s.teacher}"):
        teacher = checkpoint.load(s.teacher)
        distill.check_long(s, teacher.config.max_seq_len)
    with stops():  # a GGUF, a snapshot, a hub id or a checkpoint of --mixer=attention
        checkpoint.check_teacher(teacher, s.teacher)
    student = build_student(s, teacher, resuming).set_backend(s.backend)
    for k in ("vocab_size", "n_layer", "n_embd"):
        ours, theirs = getattr(student.config, k), getattr(teacher.config, k)
        if ours != theirs:
            fail(f"student and teacher differ in {k} ({ours} vs {theirs})")
    for d in corpora:
        if d.max_id >= student.config.vocab_size:
            fail(f"{d.path}: token id {d.max_id} is outside the model's vocabulary "
                 f"({student.config.vocab_size})")
    dtype = getattr(torch, s.dtype) if "cuda" in str(device) else torch.float32
    teacher = teacher.to(device=device, dtype=dtype)
    return teacher.eval().requires_grad_(False), student.to(device), *corpora


def save(path, student, optimizer, step, s, history):
    """One checkpoint through checkpoint.save (written whole, then renamed)."""
    checkpoint.save(path, student, background=writes_behind(student), step=step,
                    optimizer=optimizer.state_dict(), settings=asdict(s), history=history)


def writes_behind(student):
    """Whether a thread writes the checkpoints while the steps go on: on a GPU, whose host has
    cores to spare; a CPU run trains on every core, and a writing thread slows its steps."""
    return next(student.parameters()).is_cuda


# ---------------------------------------------------------------------------------------------
# The loop's helpers


def distributed(s):
    """(ddp, rank, world size, device): under torchrun one process per GPU (or CPU processes,
    gloo)."""
    if "RANK" not in os.environ:
        ddp, rank, world, device = False, 0, 1, s.device
    else:
        gpu = s.device.startswith("cuda")
        dist.init_process_group("nccl" if gpu else "gloo")
        device = f"cuda:{int(os.environ['LOCAL_RANK'])}" if gpu else s.device
        ddp, rank, world = True, dist.get_rank(), dist.get_world_size()
    if torch.device(device).index is not None:  # cuda:N: its streams (and a graph's) by default
        torch.cuda.set_device(device)
    return ddp, rank, world, device


def adamw(params, s, fused):
    """AdamW over the (name, parameter) pairs that learn, with weight decay on matrices only."""
    groups = [{"params": [p for _, p in params if p.dim() >= 2], "weight_decay": s.weight_decay},
              {"params": [p for _, p in params if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=s.learning_rate, betas=(s.beta1, s.beta2), fused=fused)


def clip(params, max_norm, device):
    """The global gradient norm, the gradients clipped to max_norm first when it is > 0."""
    if max_norm > 0:
        return torch.nn.utils.clip_grad_norm_([p for _, p in params], max_norm)
    grads = [p.grad for _, p in params if p.grad is not None]
    return torch.nn.utils.get_total_norm(grads) if grads else torch.zeros((), device=device)


class Watch:
    """The divergence watch: record() keeps the first step whose loss or gradient norm is not
    finite, on the device (no sync a step); check() reads it where the loop waits anyway (log
    lines, evals) and stops the run, naming the checkpoint that kept good weights; rising() warns
    of a 10x climb."""

    def __init__(self, s, device, saved_step):
        self.s, self.saved_step, self.low, self.warned = s, saved_step, math.inf, False
        self.bad = torch.full((), -1, dtype=torch.long, device=device)

    def record(self, step, loss, norm):
        dev = self.bad.device
        finite = torch.isfinite(norm).to(dev) & torch.isfinite(torch.as_tensor(loss)).to(dev)
        self.bad = torch.where((self.bad < 0) & ~finite, step, self.bad)

    def check(self, step, loss=None):
        first, s = int(self.bad), self.s
        if first >= 0 or (loss is not None and not math.isfinite(loss)):
            kept = (f"{ckpt_path(s)} keeps the weights of step {self.saved_step}" if self.saved_step
                    else "no checkpoint was written")
            clip_it = "" if s.grad_clip > 0 else ", or clip with --grad_clip=1"
            fail(f"step {first + 1 if first >= 0 else step}: the loss or the gradient norm is not "
                 f"finite; stopped, and {kept}. The learning rate ({s.learning_rate:g}) is likely "
                 f"too high: lower --learning_rate{clip_it}")

    def rising(self, step, loss, lr):
        if not self.warned and loss > 10 * self.low:
            print(f"warning: the loss rose from {self.low:.4g} to {loss:.4g} by step {step}; the "
                  f"learning rate ({lr:.2e} now) may be too high")
            self.warned = True
        self.low = min(self.low, loss)


class Meter:
    """The log line of a step: loss, lr, tokens/s (all GPUs together), MFU, step time, ETA."""

    def __init__(self, s, step, tokens_per_step, flops_per_token, world):
        self.s, self.tokens, self.flops, self.world = s, tokens_per_step, flops_per_token, world
        self.restart(step)

    def restart(self, step):  # after an eval: eval time is not step time
        self.t_last, self.step_last = time.time(), step

    def line(self, step, loss, lr):
        s, now = self.s, time.time()
        dt = (now - self.t_last) / (step - self.step_last)  # seconds per step since the last line
        self.t_last, self.step_last = now, step
        tok_s, eta = self.tokens / dt, int(dt * (s.max_iters - step))
        peak = self.world * s.peak_tflops * 1e12
        mfu = f"{self.flops * tok_s / peak:.1%}" if s.peak_tflops > 0 else "-"
        bar = f"{'#' * (20 * step // s.max_iters):.<20}"
        return (f"step {step}/{s.max_iters} [{bar}] loss {loss:.4f} | lr {lr:.2e} | "
                f"{tok_s:,.0f} tok/s | mfu {mfu} | {dt * 1000:.0f} ms | "
                f"eta {eta // 3600}:{eta // 60 % 60:02d}:{eta % 60:02d}")


class TeacherAhead:
    """The batches of the loop's micro-steps with the frozen teacher's pass on each, the pass of
    the next micro-step issued before this micro-step's backward. On a GPU it goes onto a CUDA
    stream of its own, so that the device runs the two side by side (the teacher's products where
    the student's kernels leave multiprocessors idle); on a CPU it runs there and then. The same
    batches and the same teacher outputs as every pass in line (--teacher_ahead off); on by
    default on a GPU."""

    def __init__(self, data, s, rank, world, device, teacher_fn):
        self.data, self.s, self.rank, self.world, self.device = data, s, rank, world, device
        self.teacher_fn = teacher_fn  # x -> the teacher's outputs for the stage's loss
        self.on, gpu = s.teacher_ahead, torch.device(device).type == "cuda"
        self.stream = torch.cuda.Stream(device) if self.on and gpu else None
        self.key, self.kept = None, None  # the micro-step issued ahead, its (x, y, outputs)

    def batch(self, step, micro, B):
        return self.data.sample(B, self.s.seed, step, micro * self.world + self.rank, self.device)

    def take(self, step, micro, B):
        """(x, y, the teacher's outputs) of micro-step `micro` of step `step`."""
        if self.key != (step, micro, B):  # not issued: the first, or the first after the switch
            x, y = self.batch(step, micro, B)
            return x, y, self.teacher_fn(x)
        x, y, out = self.kept
        self.key, self.kept = None, None
        if self.stream is not None:
            main = torch.cuda.current_stream(self.device)
            main.wait_stream(self.stream)
            for t in _tensors(out):
                t.record_stream(main)  # made on the side stream, read and freed on this one
        return x, y, out

    def issue(self, step, micro, B):
        """Start the micro-step after (step, micro), if it has B rows of the same length (the pass
        after the switch to --long_block_size is taken in line)."""
        if not self.on:
            return
        step, micro = (step, micro + 1) if micro + 1 < self.s.grad_accum else (step + 1, 0)
        if step >= self.s.max_iters or distill.length_at(step, self.s) != (self.data.T, B):
            return
        x, y = self.batch(step, micro, B)
        if self.stream is None:
            out = self.teacher_fn(x)
        else:
            self.stream.wait_stream(torch.cuda.current_stream(self.device))  # x copied in
            with torch.cuda.stream(self.stream):
                out = self.teacher_fn(x)
            x.record_stream(self.stream)
        self.key, self.kept = (step, micro, B), (x, y, out)


def _tensors(out):
    """The tensors of teacher_pass's dict (lists of them for stages 1 and 2)."""
    for v in out.values():
        yield from (v if isinstance(v, list) else [v])


class StepGraph:
    """--cuda_graph: the step's device work (each micro-step's teacher pass, the student's
    forward and backward, the clip, AdamW) captured once as a CUDA graph, then replayed every
    step with that step's batches copied into the graph's inputs. The host issues a step as one
    launch, not thousands: on a host slower than the GPU the step took the host's time
    (results/speed/README.md, "Where a stage-3 step waits"). The first `warm` steps of a length
    run as usual, so that everything is compiled and allocated before the capture; a new length
    (--long_block_size) runs `warm` more and is captured again. Serves `body` as its batches
    (take and issue, as TeacherAhead)."""

    def __init__(self, body, ahead, optimizer, device, warm=2):
        self.body, self.ahead, self.optimizer, self.device = body, ahead, optimizer, device
        self.warm = warm
        self.graph, self.out, self.shape, self.seen, self.xs, self.ys = None, None, None, 0, [], []
        self.stream = torch.cuda.Stream(device)  # warm-up, capture and replays: a side stream

    def take(self, step, micro, B):
        x = self.xs[micro]
        return x, self.ys[micro], self.ahead.teacher_fn(x)

    def issue(self, step, micro, B):
        pass  # the teacher's pass is in line, inside the graph

    def step(self, step, B, micro_steps):
        """body's (loss, gradient norm) of step `step`; on a replay, tensors the next replay
        overwrites."""
        xs, ys = zip(*(self.ahead.batch(step, m, B) for m in range(micro_steps)))
        if xs[0].shape != self.shape:  # the first step, or the switch to longer sequences
            self.graph, self.out, self.shape, self.seen = None, None, xs[0].shape, 0
        loop = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(loop)  # the batches copied in
        with torch.cuda.stream(self.stream):  # the usual steps on the capture's stream too
            if self.seen < self.warm:
                self.seen += 1
                self.xs, self.ys = xs, ys
                self.optimizer.zero_grad(set_to_none=True)  # a replay's gradients are still there
                out = self.body(self, step, B)
            else:
                if self.graph is None:
                    self.capture(step, B)
                for static, new in zip(self.xs + self.ys, xs + ys):
                    static.copy_(new)
                self.graph.replay()
                out = self.out
        loop.wait_stream(self.stream)  # the loop reads the loss and the norm there
        return out

    def capture(self, step, B):
        self.xs, self.ys = [x.clone() for x in self.xs], [y.clone() for y in self.ys]
        for group in self.optimizer.param_groups:  # AdamW reads its lr from the device
            group["capturable"] = True
            if not torch.is_tensor(group["lr"]):
                group["lr"] = torch.tensor(group["lr"], device=self.device)
        self.optimizer.zero_grad(set_to_none=True)  # the backward makes them, in the graph's memory
        with stops(errors=OSError):
            checkpoint.wait()  # no other thread at work on the GPU's memory while the graph records
        self.graph = torch.cuda.CUDAGraph()
        # torch.cuda.graph waits for the device and empties the usual steps' cached memory first:
        # the graph records into a pool of its own
        with torch.cuda.graph(self.graph, stream=self.stream):
            self.out = self.body(self, step, B)  # recorded, not run: the replay runs it


def eval_and_save(s, step, history, evaluate, student, optimizer, watch, clock):
    """Rank 0: the val metrics, then the checkpoint (past step 0) and the plot of the losses;
    their seconds go to the clock's "evals" and "checkpoints"."""
    watch.check(step)  # never a non-finite checkpoint over a finite one
    t0 = time.time()
    metrics = evaluate()
    watch.check(step, metrics["loss"])
    history["val"].append({"step": step, **metrics})
    on_gpu = next(student.parameters()).is_cuda
    mem = f" | peak mem {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB" if on_gpu else ""
    print(f"eval step {step}: val loss {metrics['loss']:.4f} | ppl {math.exp(metrics['ce']):.2f} "
          f"(teacher {math.exp(metrics['teacher_ce']):.2f}) | KL {metrics['kl']:.4f} | "
          f"top-1 agreement {metrics['top1']:.1%}{mem} | {time.time() - t0:.1f} s", flush=True)
    clock.mark("evals")
    if step > 0:  # step 0 is where the student starts: nothing to keep yet
        with stops(errors=OSError):
            save(ckpt_path(s), student, optimizer, step, s, history)
            if str(step) in s.keep_at.split(","):  # the weights alone, for a later evaluation
                checkpoint.save(f"{ckpt_path(s)[:-3]}_step{step}.pt", student,
                                background=writes_behind(student))
            if str(step) in s.branch_at.split(","):  # all of it, for another run to go on from
                save(branch_path(s, step), student, optimizer, step, s, history)
        watch.saved_step = step
    png = ckpt_path(s)[:-3] + ".png"
    if writes_behind(student):  # drawn from a copy by the thread that writes the checkpoints
        checkpoint.behind(plot, copy.deepcopy(history), png)
    else:
        plot(history, png)
    clock.mark("checkpoints")


# ---------------------------------------------------------------------------------------------
# The loop


def main(argv=None, after_step=None):
    """Train one stage; returns the loss history (a dict of lists, as stored in the checkpoint).
    after_step(step), when given, runs after every optimizer step and ends the loop by returning
    True (scripts/profile_train.py)."""
    clock = cli.Clock()  # where this run's seconds go: its last line
    with stops(errors=OSError):
        checkpoint.wait()  # a write left in flight by a run stopped in this process ends first
    s, state = settings(sys.argv[1:] if argv is None else argv)
    if state is not None and s.max_iters <= state["step"]:
        print(f"{ckpt_path(s)} is complete (step {state['step']} of {s.max_iters}); "
              f"--resume=false starts over")
        return state["history"]
    ddp, rank, world, device = distributed(s)
    master = rank == 0
    log = print if master else (lambda *a, **k: None)
    log(cli.describe(s))
    teacher, student, train_data, val_data = models_and_data(s, state is not None, device, master)
    dev_type = "cuda" if "cuda" in device else "cpu"
    autocast = s.dtype != "float32"
    ctx = torch.autocast(dev_type, dtype=getattr(torch, s.dtype)) if autocast else nullcontext()
    val_batches = val_data.fixed(s.eval_iters, s.batch_size, device)  # the same at every eval

    params = distill.set_trainable(student, s.stage)  # what learns: (name, parameter) pairs
    optimizer = adamw(params, s, fused=dev_type == "cuda")
    loss_model = distill.StageLoss(student, s.stage, s.ce_weight, s.kl_weight, s.temperature,
                                   s.backend)
    # train_model is the same module, perhaps compiled and wrapped; evals use loss_model itself
    # (whose blocks --compile_blocks compiles in place: evals run them compiled too)
    train_model, teacher_pass = loss_model, distill.teacher_pass  # the frozen teacher: forward only
    eval_teacher = teacher_pass  # evals run the teacher this way
    if s.compile and s.compile_blocks:  # one compilation serves every block of a kind
        for block in student.model.layers:
            block.compile()
        block_fn = torch.compile(distill.teacher_block)
        teacher_pass = eval_teacher = functools.partial(teacher_pass, block_fn=block_fn)
        loss_model.layer_fn = torch.compile(distill.layer_loss)  # stages 1 and 2: a layer's term
    elif s.compile:  # the whole step, fused across blocks and into the loss
        train_model, teacher_pass = torch.compile(loss_model), torch.compile(teacher_pass)
    if ddp:
        ids = [torch.cuda.current_device()] if dev_type == "cuda" else None
        train_model = DDP(train_model, device_ids=ids)
    step, history = 0, {"train": [], "val": []}
    if state is not None:
        optimizer.load_state_dict(state["optimizer"])
        for group in optimizer.param_groups:  # a --cuda_graph run's lr was a tensor: a capture
            group["lr"], group["capturable"] = float(group["lr"]), False  # sets them again
        step, history = state["step"], state["history"]
        log(f"resuming {ckpt_path(s)} at step {step}")
    state = None  # free the checkpoint's copy of the weights

    tokens_per_step = s.batch_size * s.block_size * s.grad_accum * world
    learn = sum(p.numel() for _, p in params)
    log(f"stage {s.stage}, {s.mixer} student of {s.teacher}: {student.num_params() / 1e6:.1f}M "
        f"parameters, {learn / 1e6:.1f}M learn | {s.max_iters} steps of {tokens_per_step:,} tokens "
        f"({s.max_iters * tokens_per_step:,} in all) | lr {s.learning_rate:g} {s.schedule} | "
        f"{world} x {device} {s.dtype} | data {s.data_dir}")
    watch = Watch(s, device, saved_step=step or None)  # step > 0: resumed from that checkpoint
    flops = distill.flops_per_token(s.stage, student, teacher, s.block_size)
    meter = Meter(s, step, tokens_per_step, flops, world)
    evaluate = lambda: distill.evaluate(loss_model, teacher, val_batches, ctx, eval_teacher)  # noqa: E731
    wait = torch.cuda.synchronize if dev_type == "cuda" else None  # before a clock's mark
    clock.mark("startup")  # settings, models, data, optimizer
    first = step + 1  # its time is compiling and warming up (torch.compile, Triton's JIT)
    ahead = TeacherAhead(train_data, s, rank, world, device,
                         lambda x: teacher_pass(teacher, x, s.stage))

    def step_body(batches, step, B):
        """One optimizer step on `batches` (ahead, or graph): its mean loss and gradient norm."""
        loss_sum = 0.0
        for micro in range(s.grad_accum):
            # DDP averages gradients across GPUs only on the last micro-step
            sync = not ddp or micro == s.grad_accum - 1
            with nullcontext() if sync else train_model.no_sync():
                with ctx:
                    x, y, teacher_out = batches.take(step, micro, B)  # the teacher's pass: no_grad
                    loss, parts = train_model(x, y, teacher_out)
                    batches.issue(step, micro, B)  # the next teacher pass, beside the backward
                (loss / s.grad_accum).backward()  # gradients add up over micro-steps: their mean
            loss_sum = loss_sum + parts["loss"] / s.grad_accum  # a device tensor: no sync here
        norm = clip(params, s.grad_clip, device)  # on the averaged gradient, after DDP's all-reduce
        optimizer.step()
        return loss_sum, norm

    graph = StepGraph(step_body, ahead, optimizer, device) if s.cuda_graph else None
    if graph is not None:
        log(f"--cuda_graph: the step captured after its first {graph.warm} steps, the teacher's "
            "pass in line")
    if master and step == 0:
        # where the student starts
        eval_and_save(s, step, history, evaluate, student, optimizer, watch, clock)
        meter.restart(step)
    while step < s.max_iters:
        lr = lr_at(step, s)  # a function of the step alone: resuming needs no schedule state
        for group in optimizer.param_groups:
            if torch.is_tensor(group["lr"]):  # a captured step reads it on the device
                group["lr"].fill_(lr)
            else:
                group["lr"] = lr
        T, B = distill.length_at(step, s)  # --long_block_size: the last steps longer, B * T kept
        if T != ahead.data.T:  # the switch (or a resume past it); evals keep block_size, comparable
            ahead.data = Data(s.data_dir, "train", T, ahead.data.chat)
            log(f"step {step}: sequences of {T} tokens from here, {B} a micro-step")
        if graph is None:
            loss_sum, norm = step_body(ahead, step, B)
            optimizer.zero_grad(set_to_none=True)
        else:
            loss_sum, norm = graph.step(step, B, s.grad_accum)
        watch.record(step, loss_sum, norm)
        step += 1

        if step == first:
            clock.mark("first step", wait)
        if after_step is not None and after_step(step):
            break
        if step % s.log_interval == 0 or step == s.max_iters:
            loss_val = float(loss_sum)  # waits for the device
            if master:
                watch.check(step, loss_val)
                watch.rising(step, loss_val, lr)
            history["train"].append((step, loss_val))
            log(meter.line(step, loss_val, lr))
        # kept steps are evaluated, and so is the switch to --long_block_size (the loss before it)
        kept = str(step) in s.keep_at.split(",") + s.branch_at.split(",") or (
            s.long_block_size and step == distill.long_start(s.max_iters, s.long_frac))
        if master and (step % s.eval_interval == 0 or step == s.max_iters or kept):
            clock.mark("steps", wait)
            eval_and_save(s, step, history, evaluate, student, optimizer, watch, clock)
            meter.restart(step)
    clock.mark("steps", wait)
    with stops(errors=OSError):
        checkpoint.wait()  # the last checkpoint is on disk before the stage counts as done
    clock.mark("checkpoints")
    log(clock.line())
    # every rank waits for rank 0's last eval and checkpoint (gloo may abort one that leaves early)
    if ddp:
        dist.barrier()
        dist.destroy_process_group()
    return history


if __name__ == "__main__":
    main()
