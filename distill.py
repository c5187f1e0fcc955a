"""
What each training stage is: what the student sees, what it matches, which parameters learn.
train.py is the loop; this file has no loop.

A student (checkpoint.student_from_teacher) is the teacher with every softmax attention replaced by
a linear-time mixer. It learns from the frozen teacher in three stages, then optionally SFT:

  stage 1  attention-output alignment. Every student mixer reads the teacher's residual stream
           at its layer and matches the teacher's attention output there (after o_proj).
           Loss: MSE, summed over layers. Learns: the mixers and their input norms.
  stage 2  hidden-state alignment. Every student block reads teacher hidden state l and
           matches teacher hidden state l+1. Loss: the mean over tokens of the (un-squared) L2
           distance, summed over layers. Learns: every block parameter.
  stage 3  end-to-end distillation. Loss: next-token cross-entropy plus KL(teacher || student),
           both means per token, weighted and with a temperature. Learns: everything.
           Long-context distillation (--long_block_size, below): its last steps on longer
           sequences, the same tokens a step.
  sft      instruction tuning on ChatML conversations: cross-entropy on the assistant's tokens
           only (the data's mask files). Learns: everything.
  sft_kd   instruction-aware distillation: sft's data and schedule with stage 3's loss, CE plus
           KL to the instruction-tuned teacher, both on the assistant's tokens only (the study's
           form). Learns: everything.
  lm       plain next-token cross-entropy from the teacher's weights, no teacher in the loss:
           the no-distillation baseline, and with --mixer=attention the teacher's own training
           step (the yardstick for the cost of a distillation step).

The offline default teacher is SmolLM2-135M-Instruct, instruction-tuned already: sft and sft_kd
both start from the same stage-3 student, and differ only in whether the teacher's distribution
is in the loss.

In stages 1 and 2 every layer learns at once and on its own: the teacher runs its blocks once
(teacher_pass, through the public Block modules, no hooks), and each student layer gets its own
teacher input. No student layer sees another student layer's output.

References:
1) What Matters in Linearizing Language Models? arXiv 2504.14366, and its authors' public code
   (the three stages, their losses and learning rates; where we differ is marked <--)
2) Hinton, Vinyals, Dean 2015, Distilling the Knowledge in a Neural Network (temperature, T^2)
3) Chowdhery et al. 2022, PaLM, appendix B (model FLOPs per token, for MFU)
"""

import os

import torch
import torch.nn as nn
import torch.nn.functional as F

from data import need
import mixers
import model as M

# ---------------------------------------------------------------------------------------------
# The stages

# Each stage's defaults, and the only place they live (defaults() below turns them into train.py's
# settings, and a run prints its effective settings first):
#   learning_rate  the study's peak learning rate
#   schedule       "wsd" (warmup, stable, linear decay) or "cosine"
#   data           "text" (a plain corpus, data/modern) or "chat" (ChatML with loss masks)
#   loss           what the student matches: "attention" (each layer's attention output), "hidden"
#                  (each block's output), "distill" (CE + KL to the teacher's next-token
#                  distribution) or "ce" (the next token alone, no teacher)
#   learns         which parameters learn (LEARNS below)
#   tokens         the study's budget at 135M/360M, the length of a GPU run (None: one epoch of
#                  the data)
#   start          where the student comes from: "teacher" (a new student built from it) or the
#                  name of the stage whose checkpoint it continues
COLUMNS = ("learning_rate", "schedule", "data", "loss", "learns", "tokens", "start")
STAGES = {name: dict(zip(COLUMNS, row)) for name, row in {
    #          lr    schedule  data    loss         learns    tokens         start
    "1":      (2e-4, "wsd",    "text", "attention", "mixers", 80_000_000,    "teacher"),
    "2":      (2e-3, "wsd",    "text", "hidden",    "blocks", 160_000_000,   "1"),
    "3":      (3e-4, "wsd",    "text", "distill",   "all",    2_760_000_000, "2"),
    "sft":    (3e-4, "cosine", "chat", "ce",        "all",    None,          "3"),
    # instruction-aware distillation: sft's data and schedule, stage 3's loss against the
    # (instruction-tuned) teacher, on the assistant's tokens alone
    "sft_kd": (3e-4, "cosine", "chat", "distill",   "all",    None,          "3"),
    "lm":     (3e-4, "wsd",    "text", "ce",        "all",    2_760_000_000, "teacher"),
}.items()}

LEARNS = {  # what learns -> a test on a parameter's name and the hybrid's kept softmax layers
    # the token mixers and the norms in front of them; the MLPs stay the teacher's, and so do a
    # hybrid's kept softmax layers (the teacher's own attention: nothing to align)
    "mixers": lambda name, kept: (".self_attn." in name or ".input_layernorm." in name)
    and layer_of(name) not in kept,
    # whole blocks; the embeddings (tied to the LM head) and the final norm wait
    "blocks": lambda name, kept: name.startswith("model.layers."),
    "all": lambda name, kept: True,
}


def layer_of(name):
    """The block a parameter belongs to: 'model.layers.7.mlp.up_proj.weight' -> 7, else None."""
    return int(name.split(".")[2]) if name.startswith("model.layers.") else None


def learns(name, stage, kept=()):
    """True when the parameter called `name` learns in `stage`; kept: the softmax layers a hybrid
    student keeps (its config.softmax_layers)."""
    return LEARNS[STAGES[stage]["learns"]](name, kept)


DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")  # the repository's corpora


def defaults(stage, mixer, out_dir):
    """The settings of train.py that STAGES[stage] decides: learning_rate, schedule, data_dir (the
    stage's corpus in this repository) and init_from ("teacher", or the previous stage's
    checkpoint)."""
    st = STAGES[stage]
    chat = "smoltalk" if os.path.exists(os.path.join(DATA, "smoltalk", "train.bin")) else "sharegpt"
    data_dir = os.path.relpath(os.path.join(DATA, chat if st["data"] == "chat" else "modern"))
    init_from = "teacher"
    if st["start"] != "teacher":
        init_from = os.path.join(out_dir, mixer, f"stage{st['start']}.pt")
    return dict(learning_rate=st["learning_rate"], schedule=st["schedule"], data_dir=data_dir,
                init_from=init_from)


def steps(stage, data_dir, tokens_per_step):
    """A GPU run's optimizer steps: the stage's token budget, or one epoch of data_dir's
    train.bin."""
    train_bin = os.path.join(data_dir, "train.bin")
    need(train_bin)
    return max(1, (STAGES[stage]["tokens"] or os.path.getsize(train_bin) // 2) // tokens_per_step)


# ---------------------------------------------------------------------------------------------
# Long-context distillation: the last part of a stage on text at longer sequences

# Every student of the study is distilled on 512-token sequences and tuned on 1,024, and its
# passkey collapses past that. train.py --long_block_size=L --long_frac=f runs the last f of a
# stage's steps on sequences of L tokens, the micro-batch cut so that batch_size * block_size,
# and with it the tokens of a step and of the whole budget, stays the same: whether retrieval then
# follows the training length, or stays bounded by the state, is what scripts/report.py judges.
# Needles never enter training: the longer sequences are windows of the same corpus. (Long-context
# extensions of pretrained models train their last tokens at longer sequences the same way, e.g.
# Xiong et al. 2023, Effective Long-Context Scaling of Foundation Models, arXiv 2309.16039.)


def long_start(max_iters, frac):
    """The first long step (0-based) of max_iters steps whose last frac, rounded, are long: where
    train.py switches, and where a baseline keeps the checkpoint a long run starts from."""
    return max_iters - round(frac * max_iters)


def long_steps(s):
    """How many of a run's last steps are at --long_block_size: long_frac of max_iters, rounded (0
    with the setting off)."""
    return s.max_iters - long_start(s.max_iters, s.long_frac) if s.long_block_size else 0


def length_at(step, s):
    """(block_size, batch_size) of optimizer step `step` (0-based): the run's own, or in its last
    long_steps(s) steps (long_block_size, batch_size * block_size // long_block_size). A function
    of the step alone, as the batches are: a run resumed past the switch switches where the one
    that never stopped did."""
    if step >= s.max_iters - long_steps(s):  # never with the setting off: the loop stops first
        return s.long_block_size, s.batch_size * s.block_size // s.long_block_size
    return s.block_size, s.batch_size


def check_long(s, max_seq_len=None):
    """A ValueError for long-context settings that cannot work (train.py turns it into one line):
    with the settings alone, then (max_seq_len given) against the teacher's context."""
    L, tokens = s.long_block_size, s.batch_size * s.block_size
    text = ", ".join(name for name, st in STAGES.items() if st["data"] == "text")
    if not 0 < s.long_frac <= 1:
        raise ValueError(f"--long_frac={s.long_frac!r}: expected a number above 0, at most 1")
    if L < 0:
        raise ValueError(f"--long_block_size={L}: expected 0 (off) or a sequence length")
    if not L:
        return
    if STAGES[s.stage]["data"] != "text":
        raise ValueError(f"--long_block_size={L}: stage {s.stage} trains on chat; long sequences "
                         f"are a setting of the stages on text ({text})")
    if L <= s.block_size:
        raise ValueError(f"--long_block_size={L}: expected more than --block_size={s.block_size}")
    if tokens % L:
        raise ValueError(f"--long_block_size={L} does not divide the {tokens} tokens of a "
                         f"micro-step (--batch_size={s.batch_size} x --block_size={s.block_size}), "
                         f"which its shorter batch keeps")
    if not long_steps(s):
        raise ValueError(f"--long_frac={s.long_frac}: no step of {s.max_iters} is at "
                         f"--long_block_size={L}")
    if max_seq_len is not None and L > max_seq_len:
        raise ValueError(f"--long_block_size={L} is longer than the teacher's context "
                         f"(max_seq_len {max_seq_len})")


def set_trainable(student, stage):
    """Freeze what `stage` keeps fixed; returns the (name, parameter) pairs that learn."""
    out = []
    for name, p in student.named_parameters():  # tied weights appear once
        p.requires_grad_(learns(name, stage, student.config.softmax_layers))
        if p.requires_grad:
            out.append((name, p))
    return out


# ---------------------------------------------------------------------------------------------
# The teacher's side


def teacher_block(block, x, rope):
    """One block of the teacher (model.Block.forward's two lines, kept apart): (its output, its
    attention output after o_proj), each [B, T, C]."""
    a = block.self_attn(block.input_layernorm(x), rope)
    x = x + a
    return x + block.mlp(block.post_attention_layernorm(x)), a


@torch.no_grad()
def teacher_pass(teacher, idx, stage, head=False, block_fn=teacher_block):
    """Run the frozen teacher on idx [B, T], block by block, keeping what `stage` matches.

    Returns a dict: "hidden", a list of L+1 tensors [B, T, C] (the residual stream entering
    each block, then the last block's output), and "attn", L tensors [B, T, C] (each attention
    output after o_proj), for stages 1 and 2; for stage 3, or when `head`, "final" [B, T, C]
    (the hidden states the LM head reads) and "head" (its weight [V, C]): the losses make the
    logits from these, a slice of rows at a time.
    """
    out = {}
    loss = STAGES[stage]["loss"]
    if loss == "ce" and not head:
        return out  # this loss needs no teacher
    x = teacher.model.embed_tokens(idx)  # (B, T, C)
    rope = teacher.rope(idx.shape[1], device=idx.device)
    hidden, attn = [x], []
    for block in teacher.model.layers:
        x, a = block_fn(block, x, rope)  # teacher_block, or train.py's compiled copy of it
        hidden.append(x)
        attn.append(a)
    if loss in ("attention", "hidden"):
        out["hidden"], out["attn"] = hidden, attn
    if loss == "distill" or head:
        out["final"], out["head"] = teacher.model.norm(x), teacher.lm_head.weight
    return out


# ---------------------------------------------------------------------------------------------
# The losses


def kl_per_token(teacher_logits, student_logits, temperature=1.0, mask=None):
    """KL(teacher || student) of the next-token distributions, averaged over positions.

    logits [B, T, V]; mask [B, T] (True where a position counts) or None. Both distributions
    are softened by `temperature`, and the result is scaled by temperature^2 so that its
    gradients keep their size as the temperature changes (Hinton et al.).
    <-- vs the study's code: it averaged over B*T*V entries and so summed over positions,
    weighing the KL about T times more than the cross-entropy beside it.
    """
    t = F.log_softmax(teacher_logits.float() / temperature, dim=-1)  # (B, T, V), fp32
    s = F.log_softmax(student_logits.float() / temperature, dim=-1)
    kl = (t.exp() * (t - s)).sum(-1)  # (B, T): one KL per position
    if mask is not None:
        kl = kl[mask]  # (N,) the positions that count
    return kl.mean() * temperature**2


def cross_entropy(logits, targets):
    """Mean next-token cross-entropy over the positions whose target is not -1."""
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), ignore_index=-1)


def distill_loss(student_logits, teacher_logits, targets, ce_weight=1.0, kl_weight=1.0,
                 temperature=1.0):
    """Stage 3's loss on logits [B, T, V], targets [B, T] (-1: no loss): (loss, ce, kl), where
    loss = ce_weight * cross_entropy + kl_weight * kl_per_token (ce and kl come detached, to log).
    teacher_logits None: cross-entropy alone (kl 0). This is the loss that trains on the torch
    backend, through autograd; on triton, triton_ops.head_loss computes the same loss and its
    gradient without ever holding the logits whole (tests/test_kernels_glue.py checks the two)."""
    ce = cross_entropy(student_logits, targets)
    if teacher_logits is None:
        return ce, ce.detach(), torch.zeros_like(ce)
    kl = kl_per_token(teacher_logits, student_logits, temperature, mask=targets >= 0)
    return ce_weight * ce + kl_weight * kl, ce.detach(), kl.detach()


def layer_loss(block, x, rope, want, loss):
    """One layer's term of stage 1 or 2 on the teacher's stream x [B, T, C] entering it:
    "attention", the MSE of the student's attention output to the teacher's (want); "hidden", the
    mean L2 distance of the whole block's output to the teacher's next hidden state (want)."""
    if loss == "attention":
        y = block.self_attn(block.input_layernorm(x), rope)  # (B, T, C)
        return F.mse_loss(y.float(), want.float())
    y = block(x, rope)
    return (y.float() - want.float()).norm(dim=-1).mean()


class StageLoss(nn.Module):
    """The student and its stage's loss, as one module: DistributedDataParallel wraps this,
    so that every gradient the loss produces is averaged across GPUs in one backward.

    forward(idx [B, T], targets [B, T] (-1: no loss here), teacher_out from teacher_pass)
    -> (loss, parts): loss a scalar to minimize, parts a dict of detached scalars to log.
    """

    def __init__(self, student, stage, ce_weight=1.0, kl_weight=1.0, temperature=1.0, backend=None):
        super().__init__()
        self.student, self.stage, self.backend = student, stage, backend
        self.loss = STAGES[stage]["loss"]  # "attention", "hidden", "distill" or "ce"
        self.ce_weight, self.kl_weight, self.temperature = ce_weight, kl_weight, temperature
        self.layer_fn = layer_loss  # stages 1 and 2: train.py's compiled copy serves every layer

    def forward(self, idx, targets, teacher_out):
        net = self.student
        if self.loss in ("attention", "hidden"):
            hidden = teacher_out["hidden"]
            rope = net.rope(idx.shape[1], device=idx.device)
            # stage 1: the teacher's stream -> its attention output; 2: hidden l -> hidden l+1
            want = teacher_out["attn"] if self.loss == "attention" else hidden[1:]
            loss = 0.0
            for i, block in enumerate(net.model.layers):
                loss = loss + self.layer_fn(block, hidden[i], rope, want[i], self.loss)
            return loss, {"loss": loss.detach()}
        return self.from_hidden(net.hidden(idx), targets, teacher_out)

    def from_hidden(self, h, targets, teacher_out):
        """The losses on the next token (stages 3, sft, sft_kd, lm) from the student's final hidden
        states h [B, T, C] (model.hidden) and the teacher's (teacher_pass); rows without a target
        (-1: a chat's user turns) count in neither term."""
        weight = self.student.lm_head.weight
        t_h, t_w, weights = None, None, {}  # sft and lm: cross-entropy alone
        if self.loss == "distill":
            t_h, t_w = teacher_out["final"], teacher_out["head"]
            weights = dict(ce_weight=self.ce_weight, kl_weight=self.kl_weight,
                           temperature=self.temperature)
        if mixers.resolve_backend(self.backend, h) == "triton":
            # the GPU's memory optimization: the same loss, the LM heads applied inside a fused
            # kernel a slice of rows at a time, so that no [B*T, V] logits (3 GB at 64 x 512 in
            # bf16) or their gradient ever exist
            import triton_ops

            loss, ce, kl = triton_ops.head_loss(h, weight, targets, t_h, t_w, **weights)
        else:  # the definition, through autograd
            t_logits = None if t_h is None else F.linear(t_h, t_w)
            loss, ce, kl = distill_loss(F.linear(h, weight), t_logits, targets, **weights)
        return loss, {"loss": loss.detach(), "ce": ce} | ({"kl": kl} if t_h is not None else {})


@torch.no_grad()
def compare(h, weight, t_h, t_weight, targets, rows=4096, backend=None):
    """How close the student is to the teacher on one batch, over the positions with a target:
    both cross-entropies, KL(teacher || student) and top-1 agreement (argmax equal). From the
    final hidden states h, t_h [B, T, C] and LM heads [V, C], a slice of rows at a time. On the
    triton backend the cross-entropies and the KL come from the stage-3 loss's kernel (no fp32
    copies of the logits); elsewhere from their definitions above."""
    fused = mixers.resolve_backend(backend, h) == "triton"
    if fused:
        import triton_ops
    h, t_h, y = h.flatten(0, 1), t_h.flatten(0, 1), targets.flatten()
    sums = torch.zeros(4, device=h.device)  # ce, teacher ce, kl, top-1 hits
    for i in range(0, h.shape[0], rows):
        keep = y[i:i + rows] >= 0
        n = int(keep.sum())
        if n == 0:
            continue
        # these rows' logits [n, V] with a target, and their means over the rows
        z = F.linear(h[i:i + rows][keep], weight)
        t = F.linear(t_h[i:i + rows][keep], t_weight)
        yk = y[i:i + rows][keep]
        if fused:
            _, ce, kl = triton_ops.distill_loss(z, t, yk)
            t_ce = triton_ops.distill_loss(t, None, yk)[1]
        else:
            ce, t_ce = cross_entropy(z[None], yk[None]), cross_entropy(t[None], yk[None])
            kl = kl_per_token(t, z)
        sums += n * torch.stack([ce, t_ce, kl, (z.argmax(-1) == t.argmax(-1)).float().mean()])
    n = max(int((y >= 0).sum()), 1)
    return dict(zip(("ce", "teacher_ce", "kl", "top1"), (sums / n).tolist()))


@torch.no_grad()
def evaluate(loss_model, teacher, batches, ctx, teacher_fn=teacher_pass):
    """The stage loss, and the student against the teacher, over the fixed val batches: one
    student forward a batch past stage 2 (the loss and the comparison share it). teacher_fn:
    teacher_pass, or the training loop's compiled form of it."""
    totals, net = {}, loss_model.student
    for x, y in batches:
        with ctx:
            t_out = teacher_fn(teacher, x, loss_model.stage, head=True)
            h = net.hidden(x)
            if loss_model.loss in ("attention", "hidden"):
                _, parts = loss_model(x, y, t_out)
            else:
                _, parts = loss_model.from_hidden(h, y, t_out)
            metrics = compare(h, net.lm_head.weight, t_out["final"], t_out["head"], y,
                              backend=loss_model.backend)
        metrics["loss"] = parts["loss"].item()
        for k, v in metrics.items():
            totals[k] = totals.get(k, 0.0) + v / len(batches)
    return totals


# ---------------------------------------------------------------------------------------------
# Cost, for MFU


def flops_per_token(stage, student, teacher, T):
    """Model FLOPs of one training token (PaLM's count: 2 per weight in a forward pass, 4 in a
    backward pass, plus causal attention's scores and mix). The linear mixers' own recurrence
    (about a tenth of their projections at head size 64) is left out, so MFU reads low."""
    C, V = student.config.n_embd, student.config.vocab_size

    def n(modules):
        return sum(p.numel() for m in modules for p in m.parameters())

    def attention(net):  # causal softmax attention per token, forward: q.k and the sum over v
        return sum(2 * T * C for b in net.model.layers if isinstance(b.self_attn, M.Attention))

    blocks, head = student.model.layers, 2 * V * C  # head: one forward of the LM head
    teacher_fwd = 2 * n(teacher.model.layers) + attention(teacher)  # no LM head in stages 1, 2
    loss = STAGES[stage]["loss"]
    if loss == "attention":
        # the mixers alone learn
        return 6 * n(b.self_attn for b in blocks) + 3 * attention(student) + teacher_fwd
    if loss == "hidden":
        return 6 * n(blocks) + 3 * attention(student) + teacher_fwd
    student_step = 6 * n(blocks) + 3 * attention(student) + 3 * head
    return student_step + (teacher_fwd + head if loss == "distill" else 0)
