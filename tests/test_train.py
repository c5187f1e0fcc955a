"""train.py and distill.py on a tiny random teacher and tiny token files (CPU, seconds).

Claims: every stage lowers its loss; each stage starts from the previous stage's checkpoint;
stage 1 moves only the mixers and their input norms (not a hybrid's kept softmax layers), stage
2 only blocks; the KL is a mean per token; the manual teacher pass is the teacher's forward; a killed and resumed run gives
bitwise the same losses and weights; --compile computes the same losses; autocast in bf16 on a
GPU only; bad settings stop with a readable message. Long-context distillation switches to its
length at its step with the tokens of a step kept, leaves the steps before it and the evals as
they were, and resumes bitwise from either side of the switch. scripts/train_speed.py's rows read a
run's last step and val loss from its log.
"""

import math
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

import checkpoint
import distill
import model as M
import train
from data import Data

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository
sys.path.insert(0, os.path.join(ROOT, "scripts"))

MIXER = "gated_deltanet"


@pytest.fixture(autouse=True)
def one_thread():
    # tiny models gain nothing from threads, and on a busy machine two threads can wait on
    # each other for milliseconds per op
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def tiny_teacher():
    torch.manual_seed(0)
    cfg = M.Config(vocab_size=64, n_layer=2, n_embd=32, n_head=4, n_kv_head=2, intermediate_size=64, max_seq_len=256)
    net = M.SmolLM2(cfg)
    with torch.no_grad():  # weights larger than the 0.02 init, so that layers do something
        for p in net.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.2)
    return net


def write_corpus(folder, n_train=8000, n_val=1500):
    """Documents from a noisy deterministic rule (learnable), 0 = <|endoftext|> between them;
    masks cover the last two thirds of each document (the 'assistant' part)."""
    rng = np.random.default_rng(0)
    os.makedirs(folder, exist_ok=True)
    for split, n in (("train", n_train), ("val", n_val)):
        ids, mask = [], []
        while len(ids) < n:
            L, x = int(rng.integers(20, 60)), int(rng.integers(1, 64))
            for i in range(L):
                ids.append(x)
                mask.append(int(i > L // 3))
                x = (x * 5 + 3) % 63 + 1 if rng.random() > 0.1 else int(rng.integers(1, 64))
            ids.append(0)
            mask.append(0)
        np.array(ids, np.uint16).tofile(os.path.join(folder, f"{split}.bin"))
        np.array(mask, np.uint8).tofile(os.path.join(folder, f"{split}_mask.bin"))


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("train")
    checkpoint.save(str(root / "teacher.pt"), tiny_teacher())
    write_corpus(str(root / "data"))
    return root


def args(root, **kw):
    base = dict(mixer=MIXER, teacher=root / "teacher.pt", data_dir=root / "data", out_dir=root / "out",
                block_size=32, batch_size=4, grad_accum=1, max_iters=8, eval_interval=8, eval_iters=2,
                log_interval=1, dtype="float32", device="cpu", learning_rate=1e-2)  # the same on a GPU machine
    base.update(kw)
    return [f"--{k}={v}" for k, v in base.items() if v is not None]  # None: the default


@pytest.fixture(scope="module")
def chain(setup):
    """Stages 1 -> 2 -> 3 -> sft, each from the previous one's checkpoint (the default)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)  # as one_thread, which runs after module fixtures
    try:
        return {stage: train.main(args(setup, stage=stage)) for stage in ("1", "2", "3", "sft")}
    finally:
        torch.set_num_threads(n)


@pytest.mark.parametrize("stage", ["1", "2", "3", "sft"])
def test_each_stage_lowers_its_val_loss(chain, stage):
    val = chain[stage]["val"]
    assert [v["step"] for v in val] == [0, 8]
    assert val[-1]["loss"] < 0.9 * val[0]["loss"], val


def test_stages_chain_through_checkpoints_and_plots(setup, chain):
    out = setup / "out" / MIXER
    for stage in ("1", "2", "3", "sft"):
        assert (out / f"stage{stage}.pt").exists() and (out / f"stage{stage}.png").stat().st_size > 1000
    # stage 2 starts where stage 1 ended: its step-0 eval is stage 1's last one
    assert chain["2"]["val"][0]["kl"] == pytest.approx(chain["1"]["val"][-1]["kl"], rel=1e-6)
    assert chain["3"]["val"][0]["top1"] == pytest.approx(chain["2"]["val"][-1]["top1"])
    blob = torch.load(out / "stage3.pt", weights_only=True)
    assert blob["step"] == 8 and blob["settings"]["stage"] == "3" and blob["settings"]["learning_rate"] == 1e-2


def test_a_copy_of_the_teacher_starts_stage3_at_the_teacher(setup, tmp_path):
    # scripts/train_speed.py's floor of stage 3 distills --mixer=attention from the teacher: a
    # student that is the teacher, whose first eval must find no distance to it
    first = train.main(args(setup, stage="3", mixer="attention", init_from="teacher", out_dir=tmp_path / "out",
                            max_iters=2, eval_interval=2))["val"][0]
    assert first["step"] == 0 and first["kl"] == pytest.approx(0, abs=1e-6) and first["top1"] == 1.0
    assert first["ce"] == pytest.approx(first["teacher_ce"], rel=1e-6)


def test_instruction_aware_distillation_learns_the_teachers_answers_from_stage3(setup, chain, tmp_path):
    # sft_kd: stage 3's CE + KL on sft's chat data, from stage 3's checkpoint; both terms count the
    # assistant's tokens alone, so the KL it lowers is the one sft's evaluation reports
    out = tmp_path / "out"
    shutil.copytree(setup / "out" / MIXER, out / MIXER)
    kd = train.main(args(setup, stage="sft_kd", out_dir=out))
    val = kd["val"]
    assert val[0]["kl"] == pytest.approx(chain["sft"]["val"][0]["kl"], rel=1e-6)  # the same start, data, positions
    assert val[-1]["loss"] < 0.95 * val[0]["loss"]
    assert val[-1]["kl"] < chain["sft"]["val"][-1]["kl"]  # it stays nearer the teacher than sft, which ignores it
    assert val[0]["loss"] == pytest.approx(val[0]["ce"] + val[0]["kl"], rel=1e-5)  # CE + KL, weights 1:1
    assert (out / MIXER / "stagesft_kd.pt").exists()


def test_kept_steps_are_checkpoints_of_those_steps(setup, tmp_path):
    h = train.main(args(setup, stage="1", out_dir=tmp_path, max_iters=6, eval_interval=6, keep_at="2,4"))
    assert [v["step"] for v in h["val"]] == [0, 2, 4, 6]  # each kept step is evaluated too
    _, at4 = checkpoint.read(str(tmp_path / MIXER / "stage1_step4.pt"))
    _, at6 = checkpoint.read(str(tmp_path / MIXER / "stage1.pt"))
    assert (tmp_path / MIXER / "stage1_step2.pt").exists() and _changed(at4, at6)
    # the kept weights are the run's at step 4: a run of 6 steps, cut after step 4, holds them
    with pytest.raises(SystemExit):
        train.main(args(setup, stage="1", out_dir=tmp_path / "cut", max_iters=6, eval_interval=2, keep_at="x"))
    train.main(args(setup, stage="1", out_dir=tmp_path / "cut", max_iters=6, eval_interval=4))
    _, cut = checkpoint.read(str(tmp_path / "cut" / MIXER / "stage1.pt"))
    assert not _changed(at6, cut)


def _changed(a, b):
    return {k for k in b if not torch.equal(a[k], b[k])}  # b: a checkpoint (no tied lm_head)


def test_stage1_moves_only_mixers_and_input_norms_stage2_only_blocks(setup, chain):
    teacher = checkpoint.load(str(setup / "teacher.pt"))
    torch.manual_seed(train.Settings.seed)  # the student stage 1 started from
    start = checkpoint.student_from_teacher(teacher, MIXER).state_dict()
    _, after1 = checkpoint.read(str(setup / "out" / MIXER / "stage1.pt"))
    changed = _changed(start, after1)
    mixer_keys = {k for k in start if ".self_attn." in k or ".input_layernorm." in k}
    assert changed == mixer_keys  # every mixer tensor moved, nothing else did
    _, after2 = checkpoint.read(str(setup / "out" / MIXER / "stage2.pt"))
    changed = _changed(after1, after2)
    assert changed == {k for k in start if k.startswith("model.layers.")}


def test_a_hybrids_stage1_leaves_its_kept_softmax_layers_as_the_teachers(setup, tmp_path):
    # stage 1 learns "mixers": the new token mixers and their input norms. A hybrid's kept softmax
    # layer is the teacher's own attention, so neither it nor its norm moves, weight decay included
    train.main(args(setup, stage="1", out_dir=tmp_path, max_iters=4, eval_interval=4, softmax_layers="1"))
    teacher = checkpoint.load(str(setup / "teacher.pt"))
    torch.manual_seed(train.Settings.seed)
    start = checkpoint.student_from_teacher(teacher, MIXER, softmax_layers=(1,)).state_dict()
    _, after = checkpoint.read(str(tmp_path / MIXER / "stage1.pt"))
    assert _changed(start, after) == {k for k in start if k.startswith("model.layers.0.") and
                                      (".self_attn." in k or ".input_layernorm." in k)}


def test_teacher_pass_is_the_teacher_forward():
    teacher = tiny_teacher()
    idx = torch.randint(0, 64, (2, 16))
    out = distill.teacher_pass(teacher, idx, "1", head=True)
    torch.testing.assert_close(teacher.lm_head(out["final"]), teacher(idx))
    assert out["head"] is teacher.lm_head.weight
    rope = teacher.rope(16)
    for i, block in enumerate(teacher.model.layers):
        torch.testing.assert_close(out["hidden"][i + 1], block(out["hidden"][i], rope))
    assert len(out["attn"]) == 2 and distill.teacher_pass(teacher, idx, "sft") == {}


def test_kl_is_a_mean_per_token():
    torch.manual_seed(0)
    t, s = torch.randn(2, 5, 7), torch.randn(2, 5, 7)
    p, q = t.double().softmax(-1), s.double().softmax(-1)
    by_hand = sum((p[b, i] * (p[b, i] / q[b, i]).log()).sum() for b in range(2) for i in range(5)) / 10
    assert distill.kl_per_token(t, s).item() == pytest.approx(by_hand.item(), rel=1e-5)
    # the same positions repeated 4 times over make T 4 times longer: the KL does not change
    assert distill.kl_per_token(t.repeat(1, 4, 1), s.repeat(1, 4, 1)).item() == pytest.approx(by_hand.item(), rel=1e-5)
    # a mask picks positions; the temperature softens both sides and scales by T^2
    mask = torch.zeros(2, 5, dtype=torch.bool)
    mask[1, 3] = True
    one = (p[1, 3] * (p[1, 3] / q[1, 3]).log()).sum()
    assert distill.kl_per_token(t, s, mask=mask).item() == pytest.approx(one.item(), rel=1e-5)
    p2, q2 = (t.double() / 2).softmax(-1), (s.double() / 2).softmax(-1)
    hot = 4 * (p2 * (p2 / q2).log()).sum(-1).mean()
    assert distill.kl_per_token(t, s, temperature=2.0).item() == pytest.approx(hot.item(), rel=1e-5)


@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_distill_loss_is_ce_plus_kl_written_out(temperature):
    # the stage-3 loss (what trains on the torch backend) against the formulas written out in
    # float64, with rows that do not count: values, the detached parts, and the gradient
    torch.manual_seed(0)
    t, tgt = torch.randn(2, 9, 11), torch.randint(0, 11, (2, 9))
    tgt[0, :3] = -1
    s = torch.randn(2, 9, 11, requires_grad=True)
    loss, ce, kl = distill.distill_loss(s, t, tgt, 0.7, 1.3, temperature)
    keep = tgt >= 0
    sd = s.detach().double().requires_grad_()
    ce_ref = -sd.log_softmax(-1).gather(-1, tgt.clamp(min=0)[..., None])[..., 0][keep].mean()
    pt, ls = (t.double() / temperature).softmax(-1), (sd / temperature).log_softmax(-1)
    kl_ref = (pt * (pt.log() - ls)).sum(-1)[keep].mean() * temperature**2
    ref = 0.7 * ce_ref + 1.3 * kl_ref
    assert ce.item() == pytest.approx(ce_ref.item(), rel=1e-5) and kl.item() == pytest.approx(kl_ref.item(), rel=1e-5)
    assert loss.item() == pytest.approx(ref.item(), rel=1e-5) and not ce.requires_grad and not kl.requires_grad
    g, g_ref = torch.autograd.grad(2 * loss, s)[0], torch.autograd.grad(2 * ref, sd)[0]
    torch.testing.assert_close(g.double(), g_ref, rtol=1e-5, atol=1e-7)
    assert g[0, :3].abs().max() == 0  # rows without a target get no gradient
    ce_only, _, zero = distill.distill_loss(s, None, tgt)  # no teacher: cross-entropy alone
    assert ce_only.item() == pytest.approx(ce_ref.item(), rel=1e-5) and zero.item() == 0


def test_stage_metrics_in_slices_are_those_of_the_whole_logits():
    torch.manual_seed(0)
    h, th, w, tw = torch.randn(2, 9, 8), torch.randn(2, 9, 8), torch.randn(11, 8), torch.randn(11, 8)
    y = torch.randint(0, 11, (2, 9))
    y[1, 5:] = -1
    got = distill.compare(h, w, th, tw, y, rows=4)
    z, t, keep = h @ w.t(), th @ tw.t(), y >= 0
    assert got["ce"] == pytest.approx(distill.cross_entropy(z, y).item(), rel=1e-5)
    assert got["teacher_ce"] == pytest.approx(distill.cross_entropy(t, y).item(), rel=1e-5)
    assert got["kl"] == pytest.approx(distill.kl_per_token(t, z, mask=keep).item(), rel=1e-5)
    assert got["top1"] == pytest.approx((z.argmax(-1) == t.argmax(-1))[keep].float().mean().item())


def test_stage3_loss_is_ce_plus_kl_and_zero_kl_for_a_copy_of_the_teacher():
    teacher = tiny_teacher()
    idx, tgt = torch.randint(0, 64, (2, 16)), torch.randint(0, 64, (2, 16))
    t_out = distill.teacher_pass(teacher, idx, "3")
    copy = checkpoint.student_from_teacher(teacher, "attention")
    loss, parts = distill.StageLoss(copy, "3")(idx, tgt, t_out)
    assert parts["kl"].abs().item() < 1e-6 and loss.item() == pytest.approx(parts["ce"].item(), rel=1e-6)
    torch.manual_seed(0)
    student = checkpoint.student_from_teacher(teacher, MIXER)
    loss, parts = distill.StageLoss(student, "3", ce_weight=0.5, kl_weight=2.0)(idx, tgt, t_out)
    ce = torch.nn.functional.cross_entropy(student(idx).flatten(0, 1), tgt.flatten())
    assert parts["ce"].item() == pytest.approx(ce.item(), rel=1e-5) and parts["kl"].item() > 0
    assert loss.item() == pytest.approx(0.5 * parts["ce"].item() + 2.0 * parts["kl"].item(), rel=1e-6)


def run_killed_after(monkeypatch, kill, argv):
    """train.main(argv) stopped right after its checkpoint at step `kill`, as if the process died
    there; that checkpoint's write on disk, as the process's exit would leave it."""
    real_save = train.save

    def killed(path, student, optimizer, step, s, history):
        real_save(path, student, optimizer, step, s, history)
        if step == kill:
            raise KeyboardInterrupt

    monkeypatch.setattr(train, "save", killed)
    with pytest.raises(KeyboardInterrupt):
        train.main(argv)
    monkeypatch.setattr(train, "save", real_save)
    checkpoint.wait()


def test_killed_and_resumed_run_gives_bitwise_the_same_losses(setup, tmp_path, monkeypatch):
    teacher = checkpoint.load(str(setup / "teacher.pt"))
    torch.manual_seed(1)
    start = str(tmp_path / "start.pt")
    checkpoint.save(start, checkpoint.student_from_teacher(teacher, MIXER))
    run = dict(stage="3", init_from=start, max_iters=6, eval_interval=3, grad_accum=2, learning_rate=3e-3)
    whole = train.main(args(setup, out_dir=tmp_path / "a", **run))
    run_killed_after(monkeypatch, 3, args(setup, out_dir=tmp_path / "b", **run))
    resumed = train.main(args(setup, out_dir=tmp_path / "b", **run))  # the same command again

    assert [s for s, _ in resumed["train"]] == list(range(1, 7))
    assert resumed["train"] == whole["train"]  # bitwise equal floats
    assert resumed["val"] == whole["val"]
    _, a = checkpoint.read(str(tmp_path / "a" / MIXER / "stage3.pt"))
    _, b = checkpoint.read(str(tmp_path / "b" / MIXER / "stage3.pt"))
    assert not _changed(a, b)
    # run once more: the stage is complete and nothing is trained
    assert train.main(args(setup, out_dir=tmp_path / "b", **run)) == whole


def fresh_student(setup, path):
    """A new student of the tiny teacher, saved at path: a stage-3 run's start."""
    torch.manual_seed(1)
    checkpoint.save(str(path), checkpoint.student_from_teacher(checkpoint.load(str(setup / "teacher.pt")), MIXER))
    return path


def test_long_context_switches_length_at_its_step_and_keeps_the_tokens_of_a_step(setup, tmp_path, monkeypatch,
                                                                                  capsys):
    # the last quarter of 8 steps at 64 tokens: steps 6 and 7 (0-based) draw 2 x 64 tokens a
    # micro-step where the others draw 4 x 32; every eval keeps the run's 4 x 32 val batches
    start = fresh_student(setup, tmp_path / "start.pt")
    seen, evals = [], []
    real_sample, real_evaluate = Data.sample, distill.evaluate

    def sample(self, B, seed, step, part, device):
        x, y = real_sample(self, B, seed, step, part, device)
        seen.append((step, part, tuple(x.shape), tuple(y.shape)))
        return x, y

    monkeypatch.setattr(Data, "sample", sample)
    monkeypatch.setattr(distill, "evaluate", lambda m, t, batches, ctx, teacher_fn: evals.append(
        [tuple(x.shape) for x, _ in batches]) or real_evaluate(m, t, batches, ctx, teacher_fn))
    run = dict(stage="3", init_from=start, max_iters=8, eval_interval=4, grad_accum=2, learning_rate=3e-3)
    long = train.main(args(setup, out_dir=tmp_path / "long", long_block_size=64, long_frac=0.25, **run))
    assert seen == [(k, p, (4, 32) if k < 6 else (2, 64), (4, 32) if k < 6 else (2, 64))
                    for k in range(8) for p in range(2)]
    assert evals == [[(4, 32)] * 2] * 4  # steps 0, 4, 6 (the switch) and 8: the same length before and after it
    assert "step 6: sequences of 64 tokens from here, 2 a micro-step" in capsys.readouterr().out
    s = train.Settings(max_iters=8, learning_rate=1.0, schedule="wsd", data_dir="", init_from="teacher", block_size=32,
                       batch_size=4, long_block_size=64)
    assert [distill.length_at(k, s) for k in (0, 5, 6, 7)] == [(32, 4), (32, 4), (64, 2), (64, 2)]
    s.long_block_size = 0  # off: every step at the run's length
    assert [distill.length_at(k, s) for k in (0, 7)] == [(32, 4), (32, 4)]
    # the steps before the switch are the run without the setting, to the bit; the long ones are not
    seen.clear()
    short = train.main(args(setup, out_dir=tmp_path / "short", **run))
    assert {shape for _, _, shape, _ in seen} == {(4, 32)}
    assert long["train"][:6] == short["train"][:6] and long["train"][6] != short["train"][6]
    blob = torch.load(tmp_path / "long" / MIXER / "stage3.pt", weights_only=True)
    assert blob["settings"]["long_block_size"] == 64 and blob["settings"]["long_frac"] == 0.25


def test_a_long_context_run_killed_before_or_after_the_switch_resumes_bitwise(setup, tmp_path, monkeypatch):
    # the switch at step 4 of 8; checkpoints at 3 (before it) and 6 (two long steps after it),
    # written by a thread as on a GPU
    monkeypatch.setattr(train, "writes_behind", lambda student: True)
    start = fresh_student(setup, tmp_path / "start.pt")
    run = dict(stage="3", init_from=start, max_iters=8, eval_interval=3, grad_accum=2, learning_rate=3e-3,
               long_block_size=64, long_frac=0.5)
    whole = train.main(args(setup, out_dir=tmp_path / "whole", **run))
    for kill in (3, 6):
        out = tmp_path / f"killed{kill}"
        run_killed_after(monkeypatch, kill, args(setup, out_dir=out, **run))
        assert torch.load(out / MIXER / "stage3.pt", weights_only=True)["step"] == kill
        resumed = train.main(args(setup, out_dir=out, **run))  # the same command again
        assert resumed["train"] == whole["train"] and resumed["val"] == whole["val"], kill  # bitwise equal
        _, a = checkpoint.read(str(tmp_path / "whole" / MIXER / "stage3.pt"))
        _, b = checkpoint.read(str(out / MIXER / "stage3.pt"))
        assert not _changed(a, b), kill


def test_a_run_goes_on_from_another_runs_branch_checkpoint_as_if_it_had_run_from_the_start(setup, tmp_path):
    # a baseline of 8 steps keeps its whole checkpoint at step 6, where a run with its last quarter
    # long switches; that run, started from the kept checkpoint, is the long run from step 0, to the bit
    start = fresh_student(setup, tmp_path / "start.pt")
    run = dict(stage="3", init_from=start, max_iters=8, eval_interval=4, grad_accum=2, learning_rate=3e-3)
    long = train.main(args(setup, out_dir=tmp_path / "long", long_block_size=64, long_frac=0.25, **run))
    base = train.main(args(setup, out_dir=tmp_path / "base", branch_at="6", **run))
    kept = tmp_path / "base" / MIXER / "stage3_branch6.pt"
    blob = torch.load(kept, weights_only=True)
    assert blob["step"] == 6 and blob["optimizer"]["state"] and [v["step"] for v in base["val"]] == [0, 4, 6, 8]
    os.makedirs(tmp_path / "branch" / MIXER)
    shutil.copy(kept, tmp_path / "branch" / MIXER / "stage3.pt")
    branched = train.main(args(setup, out_dir=tmp_path / "branch", long_block_size=64, long_frac=0.25, **run))
    assert branched["train"] == long["train"] and branched["val"] == long["val"]  # evaluated at the switch, both
    assert base["train"][:6] == long["train"][:6] and base["train"][6:] != long["train"][6:]
    _, a = checkpoint.read(str(tmp_path / "long" / MIXER / "stage3.pt"))
    _, b = checkpoint.read(str(tmp_path / "branch" / MIXER / "stage3.pt"))
    assert not _changed(a, b)
    with pytest.raises(SystemExit, match="--branch_at"):
        train.main(args(setup, out_dir=tmp_path / "bad", branch_at="6x", **run))


@pytest.mark.parametrize("bad, says", [
    (dict(long_block_size=48), "--long_block_size=48 does not divide the 128 tokens of a micro-step "
                               "(--batch_size=4 x --block_size=32)"),
    (dict(long_block_size=32), "--long_block_size=32: expected more than --block_size=32"),
    (dict(long_block_size=-64), "--long_block_size=-64: expected 0 (off) or a sequence length"),
    (dict(stage="sft", long_block_size=64), "stage sft trains on chat; long sequences are a setting of the "
                                            "stages on text (1, 2, 3, lm)"),
    (dict(long_frac=0), "--long_frac=0.0: expected a number above 0, at most 1"),
    (dict(long_frac=1.5, long_block_size=64), "--long_frac=1.5: expected a number above 0, at most 1"),
    (dict(long_block_size=64, long_frac=0.01), "--long_frac=0.01: no step of 8 is at --long_block_size=64"),
    (dict(long_block_size=512, batch_size=16), "--long_block_size=512 is longer than the teacher's context "
                                               "(max_seq_len 256)"),
])
def test_bad_long_context_settings_stop_in_one_line_before_any_step(setup, tmp_path, monkeypatch, bad, says):
    monkeypatch.setattr(distill, "length_at", lambda *a: pytest.fail("a step ran"))
    with pytest.raises(SystemExit) as e:
        train.main(args(setup, out_dir=tmp_path, **bad))
    msg = e.value.code
    assert isinstance(msg, str) and msg.startswith("train.py: ") and "\n" not in msg and says in msg, msg
    assert not os.path.exists(tmp_path / MIXER / "stage1.pt")


def test_the_log_line_times_steps_alone(monkeypatch):
    # steps 1-2 take 1 s each; an eval after step 3 (off the log grid) takes 60 s; step 4 takes 1 s:
    # the line at step 4 reports 1 s a step, and the first line after the start's eval too
    s = train.Settings(max_iters=10, learning_rate=1.0, schedule="wsd", data_dir="", init_from="teacher", block_size=4,
                       batch_size=2)
    clock = iter([0.0, 60.0, 62.0, 63.0, 123.0, 124.0])
    monkeypatch.setattr(train.time, "time", lambda: next(clock))
    meter = train.Meter(s, 0, tokens_per_step=8, flops_per_token=0, world=1)  # t = 0
    meter.restart(0)  # after the step-0 eval, t = 60
    assert "| 1000 ms |" in meter.line(2, 1.0, 0.1) and "8 tok/s" in meter.line(3, 1.0, 0.1)  # t = 62, 63
    meter.restart(3)  # the eval at step 3 ends at t = 123
    line = meter.line(4, 1.0, 0.1)  # t = 124
    assert "| 1000 ms |" in line and "eta 0:00:06" in line, line


def test_train_speeds_row_reads_the_runs_last_step_and_val_loss(setup, tmp_path, capsys):
    # scripts/train_speed.py reports a run's speed and its losses from train.py's log: those of its
    # last step and its last evaluation, as the run's history has them
    import train_speed

    capsys.readouterr()
    history = train.main(args(setup, stage="3", init_from="teacher", out_dir=tmp_path / "out", max_iters=4,
                              eval_interval=4, log_interval=2))
    tok_s, mfu, ms, gib, loss, val = train_speed.parse(capsys.readouterr().out)
    assert history["train"][-1][0] == 4 and loss == round(history["train"][-1][1], 4)
    assert history["val"][-1]["step"] == 4 and val == round(history["val"][-1]["loss"], 4)
    assert tok_s > 0 and ms > 0 and mfu == "-" and math.isnan(gib)  # no GPU: no MFU, no peak memory
    assert train_speed.parse("eval step 0: val loss 1.0 | ppl 2.72") is None  # no step line


def test_train_speed_rounds_turn_the_order_and_compare_medians(tmp_path, monkeypatch, capsys):
    # --rounds=4 runs a row A B, B A, A B, B A and compares the trees' medians. Two equal trees on
    # a machine that slows 10,000 tokens/s a run and runs its first run 30,000 faster still: equal
    # medians, where the first round alone makes the first tree 21% faster
    import train_speed

    assert train_speed.order(2, 3) == [(0, 0), (0, 1), (1, 1), (1, 0), (2, 0), (2, 1)]
    assert train_speed.order(3, 1) == [(0, 0), (0, 1), (0, 2)]
    assert train_speed.summary([5.0]) == (5.0, "5")
    assert train_speed.summary([3.0, 9.0, 4.0]) == (4.0, "4 (median; 3 to 9 over 3 runs)")
    ran = []

    def fake_run(args, stage, length, batch, gpus, paths, tree, tag):
        ran.append((os.path.basename(tree), tag))
        tok_s = 200_000 - 10_000 * (len(ran) - 1) + (30_000 if len(ran) == 1 else 0)
        return tok_s, "20.0%", 160.0, 30.0, 11.0, 11.1, 50.0

    trees = [tmp_path / name for name in ("base", "new")]
    for t in trees:
        t.mkdir()
        (t / "train.py").write_text("")
    monkeypatch.setattr(train_speed, "run", fake_run)
    monkeypatch.setattr(train_speed, "setup", lambda work, mixer, tree: ("teacher.pt", "student.pt", "data"))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda: "a GPU")
    argv = ["train_speed.py", "--lengths=512", "--stages=3", f"--trees={trees[0]},{trees[1]}", f"--work={tmp_path / 'work'}"]
    monkeypatch.setattr(sys, "argv", argv + ["--rounds=4"])
    capsys.readouterr()
    train_speed.main()
    out = capsys.readouterr().out
    assert [tag for _, tag in ran] == ["_tree0_run1", "_tree1_run1", "_tree1_run2", "_tree0_run2",
                                       "_tree0_run3", "_tree1_run3", "_tree1_run4", "_tree0_run4"]
    assert all(name == ("base" if tag.startswith("_tree0") else "new") for name, tag in ran)
    assert "| new, run 2 | 3 | 512 x 64 | 1 | 180,000 |" in out
    # base ran 230k, 170k, 160k, 130k; new 190k, 180k, 150k, 140k
    assert "base: stage 3, length 512, 1 GPU(s): 165,000 (median; 130,000 to 230,000 over 4 runs) tokens/s" in out
    assert "new: stage 3, length 512, 1 GPU(s): 165,000 (median; 140,000 to 190,000 over 4 runs) tokens/s" in out
    assert "new against base: stage 3, length 512, 1 GPU(s): +0.0% tokens/s (on the medians)" in out
    ran.clear()
    monkeypatch.setattr(sys, "argv", argv)  # one round: the pair as it always ran, no run numbers
    train_speed.main()
    out = capsys.readouterr().out
    assert [tag for _, tag in ran] == ["_tree0", "_tree1"] and "| new | 3 | 512 x 64 | 1 | 190,000 |" in out
    assert "new against base: stage 3, length 512, 1 GPU(s): -17.4% tokens/s\n" in out


def test_profile_parts_splits_the_committed_profiles_as_their_readme_does(tmp_path):
    # scripts/profile_parts.py on the profiles of results/speed/h100_4cc8417/ gives the table of
    # "Where the mixer's time goes" in results/speed/README.md (ms a step, to its tenth)
    import profile_parts

    d = os.path.join(ROOT, "results", "speed", "h100_4cc8417")
    got = {}
    for name in ("gdn", "attention", "kda"):
        cols, _, _ = profile_parts.parts(os.path.join(d, f"stage3_profile_{name}.txt"))
        got[name] = {part: None if ms is None else round(ms, 1) for part, ms in cols}
    gdn, floor, kda = got["gdn"], got["attention"], got["kda"]
    assert (gdn["the device busy"], floor["the device busy"], kda["the device busy"]) == (172.4, 127.7, 195.7)
    assert (gdn["matrix products"], floor["matrix products"], kda["matrix products"]) == (64.7, 60.3, 68.2)
    assert (gdn["the delta rule, forward"], gdn["the delta rule, backward"]) == (13.5, 24.5)
    assert (kda["the delta rule, forward"], kda["the delta rule, backward"]) == (18.7, 35.7)
    assert (gdn["the short conv, forward"], gdn["the short conv, backward"]) == (3.0, 9.7)
    assert (kda["the short conv, forward"], kda["the short conv, backward"]) == (2.9, 9.6)
    assert gdn["the output norm, backward"] == 2.4 and kda["the output norm, backward"] is None  # below the rows
    # the floor's SDPA: the teacher's forward and the student's, the student's backward
    assert (floor["softmax attention, forward"], floor["softmax attention, backward"]) == (4.9, 10.1)
    assert gdn["softmax attention, forward"] == 2.5 and floor["the delta rule, forward"] is None
    assert (gdn["the fused CE + KL"], floor["the fused CE + KL"]) == (6.7, 6.8)
    assert gdn["the rest"] == round(172.4 - 64.7 - 13.5 - 24.5 - 3.0 - 9.7 - 2.4 - 2.5 - 6.7, 1)
    # the command: a column a profile, each later one's difference from the first ("-" where
    # either lacks the part), the tables' smallest rows, a plot; a file that is no profile: one line
    files = [os.path.join(d, f"stage3_profile_{n}.txt") for n in ("gdn", "attention")]
    r = subprocess.run([sys.executable, "scripts/profile_parts.py", *files, "--names=gdn,floor",
                        f"--plot={tmp_path / 'parts.png'}"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "| ms a step | gdn | floor | floor - gdn |" in r.stdout
    assert "| the device busy | 172.4 | 127.7 | -44.7 |" in r.stdout
    assert "| the delta rule, forward | 13.5 | - | - |" in r.stdout
    assert "| softmax attention, forward | 2.5 | 4.9 | 2.4 |" in r.stdout
    assert "below its smallest row: gdn 2.41 ms, floor 1.43 ms a step" in r.stdout
    assert (tmp_path / "parts.png").stat().st_size > 10_000
    r = subprocess.run([sys.executable, "scripts/profile_parts.py", os.path.join(ROOT, "README.md")], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 1 and "not a GPU step table" in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_profile_parts_reads_each_unit_once_and_names_what_it_leaves_out(tmp_path):
    # a table in profile_train.py's layout: Self CUDA in us, ms and s, an Inductor kernel listed
    # twice (its launcher's row and its own: counted once), the steps' row left out, an operator
    # of the project's that no part claims named in the footer; a table without rows refused
    import profile_parts

    cols = ["Name", "Self CPU %", "Self CPU", "CPU total %", "CPU total", "CPU time avg", "Self CUDA",
            "Self CUDA %", "CUDA total", "CUDA time avg", "# of Calls"]

    def row(name, self_cuda, calls=10):
        return "  ".join([f"{name:>40}", "1.00%", "1.000ms", "1.00%", "1.000ms", "1.000us", self_cuda, "1.00%",
                          "9.999s", "1.000ms", str(calls)])

    rule = "  ".join(["-" * 40] + ["-" * 12] * 10)
    head = "profile: 2 steps after 3 warm-up, 90.0 ms a step, device busy 80.0 ms a step (89%)\n\n"
    table = [rule, "  ".join([f"{cols[0]:>40}"] + [f"{c:>12}" for c in cols[1:]]), rule,
             row("ProfilerStep*", "1.500s"), row("aten::mm", "0.060s"), row("linearize::delta_rule_fwd", "3000.000us"),
             row("linearize::delta_rule_bwd", "5.000ms"), row("triton_poi_fused_add_0", "2.000ms"),
             row("triton_poi_fused_add_0", "2.000ms"), row("linearize::step_delta", "400.000us"), rule]
    f = tmp_path / "stage3_profile.txt"
    f.write_text(head + "\n".join(table) + "\n")
    steps, busy, ops = profile_parts.read(str(f))
    assert (steps, busy) == (2, 80.0) and "ProfilerStep*" not in ops
    assert ops == {"aten::mm": 60.0, "linearize::delta_rule_fwd": 3.0, "linearize::delta_rule_bwd": 5.0,
                   "triton_poi_fused_add_0": 2.0, "linearize::step_delta": 0.4}
    got, least, unclaimed = profile_parts.parts(str(f))
    got = dict(got)
    assert (got["matrix products"], got["the delta rule, forward"], got["the delta rule, backward"]) == (30.0, 1.5, 2.5)
    assert got["the rest"] == 80.0 - 30.0 - 1.5 - 2.5 and least == 0.2 and unclaimed == ["linearize::step_delta"]
    lines, _ = profile_parts.table([str(f)], ["one"])
    assert lines[-1] == "one: in the rest, operators of no part: linearize::step_delta"
    f.write_text(head + "\n".join(table[:3]) + "\n")  # the header, no rows
    with pytest.raises(ValueError, match="no operator rows"):
        profile_parts.read(str(f))


def test_schedules_warm_up_and_decay_to_the_floor():
    s = train.Settings(max_iters=100, learning_rate=1.0, warmup_frac=0.1, decay_frac=0.2, min_lr_frac=0.1, schedule="wsd",
                       data_dir="", init_from="teacher")
    lrs = [train.lr_at(i, s) for i in range(100)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == 1.0 and lrs[79] == 1.0  # warmup, then stable
    assert all(a > b for a, b in zip(lrs[79:], lrs[80:])) and lrs[-1] == pytest.approx(0.1)  # decays
    s.schedule = "cosine"
    lrs = [train.lr_at(i, s) for i in range(100)]
    assert lrs[9] == 1.0 and lrs[-1] == pytest.approx(0.1) and lrs[50] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 41 / 90)))


def test_chat_windows_start_at_conversations_and_mask_targets(setup):
    data = Data(str(setup / "data"), "val", 32, chat=True)
    tokens = np.fromfile(setup / "data" / "val.bin", dtype=np.uint16).astype(np.int64)
    mask = np.fromfile(setup / "data" / "val_mask.bin", dtype=np.uint8)
    assert data.n == len(data.starts) > 3 and all(p == 0 or tokens[p - 1] == 0 for p in data.starts)
    x, y = data.get(np.arange(3), "cpu")
    for row, p in enumerate(data.starts[:3]):
        want = np.where(mask[p + 1:p + 33] == 1, tokens[p + 1:p + 33], -1)
        assert x[row].tolist() == tokens[p:p + 32].tolist() and y[row].tolist() == want.tolist()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a batch's copy to a GPU")
def test_a_batch_reaches_the_gpu_without_waiting_for_the_gpu(setup):
    # from pinned memory and asynchronously: a copy from pageable memory first waits for every
    # kernel queued on the stream (torch's sync debug mode raises on such a wait), and the loop's
    # host could not issue a step ahead of the device
    data = Data(str(setup / "data"), "val", 32, chat=True)
    want = data.get(np.arange(3), "cpu")
    torch.cuda.set_sync_debug_mode("error")
    try:
        got = data.get(np.arange(3), "cuda")
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert all(g.is_cuda and torch.equal(g.cpu(), w) for g, w in zip(got, want))


@pytest.mark.parametrize("bad, says", [
    (dict(stage="4"), ["--stage='4'", "1, 2, 3, sft"]),
    (dict(mixer="mamba"), ["--mixer='mamba'", "gated_deltanet"]),
    (dict(batch_size="four"), ["--batch_size='four'", "expected an integer"]),
    (dict(resume="maybe"), ["--resume='maybe'", "true or false"]),
    (dict(batchsize=4), ["--batchsize=4", "did you mean --batch_size"]),
    (dict(stage="2", out_dir="EMPTY"), ["stage1.pt not found", f"python train.py --mixer={MIXER} --stage=1"]),
    (dict(data_dir="NOWHERE"), ["NOWHERE/train.bin not found"]),
    (dict(teacher="NOWHERE/t.pt"), ["--teacher=NOWHERE/t.pt", "no such file"]),
    (dict(cuda_graph="true"), ["--cuda_graph", "--device=cpu has none"]),
    (dict(softmax_layers="0,2"), ["--softmax_layers='0,2'", "the teacher has 2 layers, numbered 0 to 1"]),
    (dict(softmax_layers="1,1"), ["--softmax_layers='1,1'", "a layer is named twice"]),
    (dict(softmax_layers="x"), ["--softmax_layers='x'", "such as 7,15,23"]),
])
def test_bad_settings_stop_with_a_readable_message(setup, tmp_path, bad, says):
    bad = {k: str(v).replace("EMPTY", str(tmp_path / "empty")).replace("NOWHERE", str(tmp_path / "nowhere"))
           for k, v in bad.items()}
    bad.setdefault("out_dir", tmp_path / "out")
    with pytest.raises(SystemExit) as e:
        train.main(args(setup, **bad))
    msg = e.value.code
    assert isinstance(msg, str) and msg.startswith("train.py: ")
    for part in says:
        assert part.replace("NOWHERE", str(tmp_path / "nowhere")) in msg, msg


def test_bf16_autocast_on_a_gpu_and_fp32_on_a_cpu(tmp_path, monkeypatch):
    # on a CPU without native bf16 (AVX2 alone) a bf16 product runs some 40 times slower than fp32
    rest = [f"--out_dir={tmp_path}", "--resume=false", "--max_iters=1"]  # a GPU run without one needs the data
    for gpu, device, want in [(False, [], "float32"), (True, [], "bfloat16"), (True, ["--device=cpu"], "float32")]:
        monkeypatch.setattr(torch.cuda, "is_available", lambda gpu=gpu: gpu)
        assert train.settings(rest + device)[0].dtype == want, (gpu, device)
    assert train.settings(rest + ["--dtype=float32"])[0].dtype == "float32"  # a GPU run, told so


def test_missing_default_data_names_the_prepare_command(setup, tmp_path, monkeypatch):
    (tmp_path / "data" / "modern").mkdir(parents=True)  # a checkout whose corpus is not built yet
    (tmp_path / "data" / "modern" / "prepare.py").write_text("")
    monkeypatch.setattr(distill, "DATA", str(tmp_path / "data"))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as e:
        train.main(args(setup, data_dir=None, out_dir=tmp_path / "out"))
    assert "python data/modern/prepare.py" in e.value.code


def test_two_processes_train_like_one_with_twice_the_micro_steps(setup, tmp_path):
    """torchrun with 2 CPU processes (gloo) and 1 micro-step each = 1 process with 2 micro-steps:
    the same batches (part = micro-step * processes + rank) and the same averaged gradients."""
    common = args(setup, stage="lm", max_iters=3, eval_interval=3, resume="false")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "train.py", *common, f"--out_dir={tmp_path / 'two'}"]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "2 x cpu" in done.stdout
    one = train.main(common + [f"--out_dir={tmp_path / 'one'}", "--grad_accum=2"])
    _, a = checkpoint.read(str(tmp_path / "one" / MIXER / "stagelm.pt"))
    _, b = checkpoint.read(str(tmp_path / "two" / MIXER / "stagelm.pt"))
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-6)
    two = torch.load(tmp_path / "two" / MIXER / "stagelm.pt", weights_only=True)["history"]
    assert two["val"][-1]["loss"] == pytest.approx(one["val"][-1]["loss"], rel=1e-4)


def test_profile_writes_a_table_and_a_trace_and_no_checkpoint(setup, capsys):
    import profile_train

    out = setup / "profiled"
    profile_train.main(["--steps=2"] + args(setup, out_dir=out, stage="lm", mixer="attention"))
    base = out / "attention" / "stagelm"
    table = (base.parent / (base.name + "_profile.txt")).read_text()
    assert table.startswith("profile: 2 steps after 3 warm-up") and "aten::mm" in table
    names = [re.split(r"\s{2,}", line.strip())[0] for line in table.splitlines()[5:] if line.strip()
             and not line.startswith("-")]
    assert max(map(len, names)) > 55 and not any(n.endswith("...") for n in names)  # whole, not cut at 55
    trace = (base.parent / (base.name + "_profile.json")).read_text()
    assert '"traceEvents"' in trace and "aten::mm" in trace
    assert not (base.parent / (base.name + ".pt")).exists()  # a measurement writes no checkpoint
    assert "ms a step" in capsys.readouterr().out
    # --eval: one evaluation profiled instead, and still no checkpoint
    profile_train.main(["--eval"] + args(setup, out_dir=out, stage="lm", mixer="attention"))
    table = (base.parent / (base.name + "_eval_profile.txt")).read_text()
    assert table.startswith("profile: one evaluation of 2 val batches") and "aten::mm" in table
    assert not (base.parent / (base.name + ".pt")).exists()
    assert "ms an evaluation" in capsys.readouterr().out


@pytest.fixture
def without_inductor(monkeypatch):
    """torch.compile through Dynamo and AOTAutograd alone (backend aot_eager): the graphs train.py
    makes, their backward and the optimizer on the compiled module's weights, without Inductor's
    C++ (a minute or two of compiling a test on a CPU). Inductor's code for a student's stage
    losses and teacher pass, compiled whole, is checked in tests/test_kernels_glue.py. Dynamo's
    caches are emptied before and after: a function compiled before at other shapes would be
    traced again with dynamic ones, whose backward aot_eager cannot always run (a view of a
    non-contiguous gradient, which Inductor makes a copy)."""
    torch._dynamo.reset()
    compile_ = torch.compile
    monkeypatch.setattr(torch, "compile", lambda *a, **kw: compile_(*a, **{**kw, "backend": "aot_eager"}))
    yield
    torch._dynamo.reset()


def test_compiled_training_matches_eager(setup, tmp_path, without_inductor):
    # --compile=true compiles the student and its loss; it computes the same function
    losses = {}
    for compiled in (False, True):
        h = train.main(args(setup, out_dir=tmp_path / str(compiled), stage="1", max_iters=3, eval_interval=3,
                            compile=compiled))
        losses[compiled] = [loss for _, loss in h["train"]]
    assert losses[True] == pytest.approx(losses[False], rel=1e-4)


@pytest.mark.parametrize("stage", ["1", "2", "3", "sft_kd"])
def test_blocks_compiled_one_by_one_train_as_eager(setup, tmp_path, without_inductor, monkeypatch, stage):
    # --compile_blocks=true compiles each block (the student's and the teacher's), not the step,
    # and for stages 1 and 2 a layer's term of the loss; sft_kd as well (chat data, the
    # assistant's tokens alone: what reproduce.py's SFT compiles)
    from torch._dynamo.utils import counters

    compiled, compile_ = [], torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: compiled.append(fn) or compile_(fn, **kw))
    losses = {}
    counters.clear()
    for blocks in (None, True):
        extra = dict(compile=True, compile_blocks=True) if blocks else {}
        h = train.main(args(setup, out_dir=tmp_path / str(blocks), stage=stage, init_from="teacher", max_iters=2,
                            eval_interval=2, **extra))
        losses[blocks] = [loss for _, loss in h["train"]] + [v["loss"] for v in h["val"]]
    assert losses[True] == pytest.approx(losses[None], rel=1e-4)
    # the student's block (training, and evaluating without gradients), the teacher's, and in
    # stages 1 and 2 the layer's term (training, and evaluating): one compilation each for both
    # layers (one a layer would be at least twice as many)
    assert 2 <= counters["stats"]["unique_graphs"] <= (4 if stage in ("1", "2") else 3)
    assert distill.layer_loss in compiled and distill.teacher_block in compiled


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs")
@pytest.mark.parametrize("stage", ["1", "3"])
def test_a_captured_step_trains_as_the_usual_loop(setup, tmp_path, monkeypatch, stage):
    # --cuda_graph: two usual steps a length, then the step captured and replayed, its batches
    # copied in; a switch to longer sequences captures again; a cosine schedule, so that every
    # replay has a learning rate of its own. The losses of the usual loop (the teacher's pass in
    # line in both): the first step's within 1e-5, relative, and every one within 1e-3, where
    # runs in one process on a GPU drift apart by up to 1.35e-4 from their second step
    # (results/speed/README.md, "The teacher ahead") and a replay that kept one step's batches
    # moves a loss of this run by 1% to 20% (on a CPU). Then the captured run killed after its
    # checkpoint at step 4 (two replays in) and run again: it goes on as the whole run did
    replays, real = [], torch.cuda.CUDAGraph.replay
    monkeypatch.setattr(torch.cuda.CUDAGraph, "replay", lambda g: (replays.append(1), real(g))[1])
    run = dict(stage=stage, init_from="teacher", max_iters=8, eval_interval=4, grad_accum=2, long_block_size=64,
               long_frac=0.5, schedule="cosine", teacher_ahead=False, device="cuda", dtype="bfloat16")
    losses = lambda h: [loss for _, loss in h["train"]] + [v["loss"] for v in h["val"]]
    runs = {}
    for on in (False, True):
        replays.clear()
        runs[on] = losses(train.main(args(setup, out_dir=tmp_path / str(on), cuda_graph=on, **run))), len(replays)
    assert runs[False][1] == 0 and runs[True][1] == 4  # steps 3 and 4 at 32 tokens, 7 and 8 at 64
    (off, _), (on, _) = runs[False], runs[True]
    assert len(on) == len(off) == 8 + 3 and on[0] == pytest.approx(off[0], rel=1e-5)
    assert all(b == pytest.approx(a, rel=1e-3) for a, b in zip(off, on)), (off, on)

    run_killed_after(monkeypatch, 4, args(setup, out_dir=tmp_path / "killed", cuda_graph=True, **run))
    resumed = losses(train.main(args(setup, out_dir=tmp_path / "killed", cuda_graph=True, **run)))
    assert all(b == pytest.approx(a, rel=1e-3) for a, b in zip(on, resumed)), (on, resumed)


@pytest.mark.parametrize("stage", ["1", "2", "3"])
def test_the_teacher_pass_issued_ahead_changes_no_number(setup, tmp_path, monkeypatch, stage):
    # the next micro-step's teacher pass is issued before this one's backward (on a GPU, on a
    # stream of its own, beside it): the same batches and the same teacher outputs to the bit as
    # every pass in line, so the same losses. Two micro-steps a step (the next micro-step and the
    # next step's first are issued) and a switch to longer sequences (the pass after it in line)
    gpu = torch.cuda.is_available()
    served, real_take = [], train.TeacherAhead.take

    def take(self, step, micro, B):
        ahead = self.key == (step, micro, B)  # issued ahead
        x, y, out = real_take(self, step, micro, B)
        served.append((ahead, [t.cpu() for t in (x, y, *train._tensors(out))]))
        return x, y, out

    monkeypatch.setattr(train.TeacherAhead, "take", take)
    runs = {}
    for on in (False, True):
        served.clear()
        h = train.main(args(setup, out_dir=tmp_path / str(on), stage=stage, init_from="teacher", max_iters=6,
                            eval_interval=3, grad_accum=2, long_block_size=64, long_frac=0.5, teacher_ahead=on,
                            **(dict(device="cuda", dtype="bfloat16") if gpu else {})))
        runs[on] = ([loss for _, loss in h["train"]], [v["loss"] for v in h["val"]], list(served))
    # 12 micro-steps: the first, and the first at 64 tokens (step 3), in line; the rest ahead
    assert [a for a, _ in runs[False][2]] == [False] * 12
    assert [a for a, _ in runs[True][2]] == [False, True, True, True, True, True, False, True, True, True, True, True]
    for (_, off), (_, on) in zip(runs[False][2], runs[True][2]):
        assert len(on) == len(off) and all(torch.equal(a, b) for a, b in zip(on, off))
    if not gpu:
        assert runs[True][:2] == runs[False][:2]
    else:  # the first step's loss within 1e-5, relative, of the in-line run's: on a GPU a run
        # trains a little differently from runs before it in the same process, ahead or in line
        # alike, from its second step on, and once (a pytest worker that had run other tests) at
        # its first, 1.4e-6 apart (relative) (results/speed/README.md, "The teacher ahead" and
        # "The delta rule's products on bf16 operands"); the batches and the teacher's outputs,
        # above, stay equal to the bit
        first_off, first_on = runs[False][0][0], runs[True][0][0]
        assert abs(first_on - first_off) <= 1e-5 * abs(first_off), (first_on, first_off)
