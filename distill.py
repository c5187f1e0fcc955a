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
  sft      instruction tuning on ChatML conversations: cross-entropy on the assistant's tokens
           only (the data's mask files). Learns: everything.
  lm       plain next-token cross-entropy from the teacher's weights, no teacher in the loss:
           the no-distillation baseline, and with --mixer=attention the teacher's own training
           step (the yardstick for the cost of a distillation step).

Instruction-aware distillation is the same stages against an instruction-tuned teacher, then
sft: only --teacher changes (the offline default teacher already is SmolLM2-135M-Instruct).

In stages 1 and 2 every layer learns at once and on its own: the teacher runs its blocks once
(teacher_pass, through the public Block modules, no hooks), and each student layer gets its own
teacher input. No student layer sees another student layer's output.

References:
1) What Matters in Linearizing Language Models? arXiv 2504.14366, and its authors' public code
   (the three stages, their losses and learning rates; where we differ is marked <--)
2) Hinton, Vinyals, Dean 2015, Distilling the Knowledge in a Neural Network (temperature, T^2)
3) Chowdhery et al. 2022, PaLM, appendix B (model FLOPs per token, for MFU)
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

import mixers
import model as M

# ---------------------------------------------------------------------------------------------
# The stages

# lr: peak learning rate (the study's). schedule: "wsd" = warmup-stable-decay, "cosine".
# start: where the student comes from by default, "teacher" (built from it) or a stage name
# (that stage's checkpoint). data: "text" (plain corpus) or "chat" (ChatML with loss masks).
# tokens: the study's budget at 135M/360M, the default length of a GPU run (0: one epoch).
STAGES = {
    "1": dict(lr=2e-4, schedule="wsd", start="teacher", data="text", tokens=80_000_000),
    "2": dict(lr=2e-3, schedule="wsd", start="1", data="text", tokens=160_000_000),
    "3": dict(lr=3e-4, schedule="wsd", start="2", data="text", tokens=2_760_000_000),
    "sft": dict(lr=3e-4, schedule="cosine", start="3", data="chat", tokens=0),
    "lm": dict(lr=3e-4, schedule="wsd", start="teacher", data="text", tokens=2_760_000_000),
}


def learns(name, stage):
    """True when the parameter called `name` (student.named_parameters()) learns in `stage`."""
    if stage == "1":  # the token mixer and the norm in front of it; MLPs stay the teacher's
        return ".self_attn." in name or ".input_layernorm." in name
    if stage == "2":  # whole blocks; the embeddings (tied to the LM head) and final norm wait
        return name.startswith("model.layers.")
    return True  # stage 3, sft, lm: everything


def set_trainable(student, stage):
    """Freeze what `stage` keeps fixed; returns the (name, parameter) pairs that learn."""
    out = []
    for name, p in student.named_parameters():  # tied weights appear once
        p.requires_grad_(learns(name, stage))
        if p.requires_grad:
            out.append((name, p))
    return out


# ---------------------------------------------------------------------------------------------
# The teacher's side


@torch.no_grad()
def teacher_pass(teacher, idx, stage, logits=False):
    """Run the frozen teacher on idx [B, T], block by block, keeping what `stage` matches.

    Returns a dict: "hidden", a list of L+1 tensors [B, T, C] (the residual stream entering
    each block, then the last block's output), and "attn", L tensors [B, T, C] (each attention
    output after o_proj), for stages 1 and 2; "logits" [B, T, V] for stage 3 or when asked.
    """
    out = {}
    if stage in ("sft", "lm") and not logits:
        return out  # these losses need no teacher
    x = teacher.model.embed_tokens(idx)  # (B, T, C)
    rope = teacher.rope(idx.shape[1], device=idx.device)
    hidden, attn = [x], []
    for block in teacher.model.layers:  # the two lines of model.Block.forward, kept apart
        a = block.self_attn(block.input_layernorm(x), rope)  # (B, T, C)
        x = x + a
        x = x + block.mlp(block.post_attention_layernorm(x))
        hidden.append(x)
        attn.append(a)
    if stage in ("1", "2"):
        out["hidden"], out["attn"] = hidden, attn
    if stage == "3" or logits:
        out["logits"] = teacher.lm_head(teacher.model.norm(x))  # (B, T, V)
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


def distill_loss(student_logits, teacher_logits, targets, ce_weight=1.0, kl_weight=1.0, temperature=1.0,
                 backend=None):
    """Stage 3's loss on logits [B, T, V], targets [B, T] (-1: no loss): (loss, ce, kl), where
    loss = ce_weight * cross_entropy + kl_weight * kl_per_token (ce and kl come detached, to log).
    teacher_logits None: cross-entropy alone (kl 0). Backend triton (the default for CUDA
    tensors): one fused kernel, kernels.distill_loss, computes the same loss and its gradient in
    closed form, in the logits' dtype (autograd keeps several fp32 copies of [B, T, V] here)."""
    f = mixers.forms(backend, student_logits)  # kernels.py for triton, as the mixers choose
    if f is not mixers.TORCH:
        t = None if teacher_logits is None else teacher_logits.flatten(0, 1)
        return f.distill_loss(student_logits.flatten(0, 1), t, targets.flatten(), ce_weight, kl_weight,
                                    temperature)
    ce = cross_entropy(student_logits, targets)
    if teacher_logits is None:
        return ce, ce.detach(), torch.zeros_like(ce)
    kl = kl_per_token(teacher_logits, student_logits, temperature, mask=targets >= 0)
    return ce_weight * ce + kl_weight * kl, ce.detach(), kl.detach()


class StageLoss(nn.Module):
    """The student and its stage's loss, as one module: DistributedDataParallel wraps this,
    so that every gradient the loss produces is averaged across GPUs in one backward.

    forward(idx [B, T], targets [B, T] (-1: no loss here), teacher_out from teacher_pass)
    -> (loss, parts): loss a scalar to minimize, parts a dict of detached scalars to log.
    """

    def __init__(self, student, stage, ce_weight=1.0, kl_weight=1.0, temperature=1.0, backend=None):
        super().__init__()
        self.student, self.stage, self.backend = student, stage, backend
        self.ce_weight, self.kl_weight, self.temperature = ce_weight, kl_weight, temperature

    def forward(self, idx, targets, teacher_out):
        net = self.student
        if self.stage in ("1", "2"):
            hidden = teacher_out["hidden"]
            rope = net.rope(idx.shape[1], device=idx.device)
            loss = 0.0
            for i, block in enumerate(net.model.layers):
                if self.stage == "1":  # mixer on the teacher's stream -> the teacher's attention output
                    y = block.self_attn(block.input_layernorm(hidden[i]), rope)  # (B, T, C)
                    loss = loss + F.mse_loss(y.float(), teacher_out["attn"][i].float())
                else:  # whole block on teacher hidden l -> teacher hidden l+1
                    y = block(hidden[i], rope)  # (B, T, C)
                    loss = loss + (y.float() - hidden[i + 1].float()).norm(dim=-1).mean()
            return loss, {"loss": loss.detach()}
        logits = net(idx)  # (B, T, V)
        if self.stage != "3":  # sft and lm: cross-entropy alone
            ce, _, _ = distill_loss(logits, None, targets, backend=self.backend)
            return ce, {"loss": ce.detach(), "ce": ce.detach()}
        loss, ce, kl = distill_loss(logits, teacher_out["logits"], targets, self.ce_weight, self.kl_weight,
                                    self.temperature, self.backend)
        return loss, {"loss": loss.detach(), "ce": ce, "kl": kl}


@torch.no_grad()
def compare(student_logits, teacher_logits, targets):
    """How close the student is to the teacher on one batch, over the positions with a target:
    both cross-entropies, KL(teacher || student) and top-1 agreement (argmax equal)."""
    mask = targets >= 0  # (B, T)
    same = student_logits.argmax(-1) == teacher_logits.argmax(-1)  # (B, T)
    return {
        "ce": cross_entropy(student_logits, targets).item(),
        "teacher_ce": cross_entropy(teacher_logits, targets).item(),
        "kl": kl_per_token(teacher_logits, student_logits, mask=mask).item(),
        "top1": same[mask].float().mean().item(),
    }


@torch.no_grad()
def evaluate(loss_model, teacher, batches, ctx):
    """The stage loss, and the student against the teacher, over the fixed val batches."""
    totals = {}
    for x, y in batches:
        with ctx:
            t_out = teacher_pass(teacher, x, loss_model.stage, logits=True)
            _, parts = loss_model(x, y, t_out)
            metrics = compare(loss_model.student(x), t_out["logits"], y)
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
    if stage == "1":
        return 6 * n(b.self_attn for b in blocks) + 3 * attention(student) + teacher_fwd  # mixers only
    if stage == "2":
        return 6 * n(blocks) + 3 * attention(student) + teacher_fwd
    student_step = 6 * n(blocks) + 3 * attention(student) + 3 * head
    return student_step + (teacher_fwd + head if stage == "3" else 0)
