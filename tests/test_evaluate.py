"""evaluate.py against hand computations on a tiny random model: perplexity, KL per token,
and multiple-choice accuracy with raw and per-byte normalized log-likelihood."""

import json
import math

import numpy as np
import pytest
import torch

import checkpoint
import evaluate as E
import model as M

V = 64  # tiny vocabulary: the character tokenizer below maps text into it


def tiny(seed, vocab=V):
    torch.manual_seed(seed)
    cfg = M.Config(vocab_size=vocab, n_layer=2, n_embd=32, n_head=2, n_kv_head=1, intermediate_size=64)
    return M.SmolLM2(cfg).eval()


class CharTok:
    eot_id = 0

    def encode(self, text):
        return [1 + ord(c) % (V - 1) for c in text]


def log_probs(net, ids):
    """Hand computation: log p(ids[t] | ids[:t]) for t >= 1, each from its own forward on the
    prefix alone (no batching, no windows), through float64 log-sum-exp."""
    out = []
    for t in range(1, len(ids)):
        with torch.no_grad():
            z = net(torch.tensor([ids[:t]]))[0, -1].double().numpy()
        out.append(z - (z.max() + math.log(np.exp(z - z.max()).sum())))  # log softmax over V
    return [lp[ids[t + 1]] for t, lp in enumerate(out)], out


def test_perplexity_and_kl_match_a_hand_computation():
    net, teacher = tiny(0), tiny(1)
    data = np.random.default_rng(0).integers(0, V, 200).astype(np.uint16)
    got = E.lm_metrics(net, data, seq_len=16, max_windows=3, batch_size=2, teacher=teacher)
    starts = np.linspace(0, len(data) - 17, 3).astype(int)  # evenly spaced, as documented
    nll, kl, n = 0.0, 0.0, 0
    for s in starts:
        ids = data[s:s + 17].tolist()
        lp, full = log_probs(net, ids)
        _, full_t = log_probs(teacher, ids)
        nll -= sum(lp)
        kl += sum((np.exp(q) * (q - p)).sum() for p, q in zip(full, full_t))  # KL(teacher || student)
        n += len(lp)
    assert got["tokens"] == n == 48
    assert got["loss"] == pytest.approx(nll / n, rel=1e-4)
    assert got["ppl"] == pytest.approx(math.exp(nll / n), rel=1e-4)
    assert got["kl"] == pytest.approx(kl / n, rel=1e-3) and got["kl"] > 0
    assert E.lm_metrics(net, data, 16, 3, 2, teacher=net)["kl"] == pytest.approx(0, abs=1e-5)


def test_multiple_choice_scores_match_a_hand_computation():
    net, tok = tiny(2), CharTok()
    questions = [
        {"requests": [("Q: sky? A:", " blue"), ("Q: sky? A:", " a very long green answer")], "gold": 0},
        {"requests": [("Sam saw Ann so Sam", " ran."), ("Sam saw Ann so Ann", " ran.")], "gold": 1},
        {"requests": [("x", " ab"), ("x", " abcdefgh"), ("x", " q")], "gold": 2},
    ] * 2
    flat = [r for q in questions for r in q["requests"]]
    got = E.loglikelihoods(net, tok, flat, batch_size=3)
    assert [s for s, _ in got] == pytest.approx([s for s, _ in E.loglikelihoods(net, tok, flat, batch_size=1)], abs=1e-4)
    acc = acc_norm = 0
    for q in questions:
        sums = []
        for ctx, cont in q["requests"]:
            c, x = tok.encode(ctx), tok.encode(cont)
            lp, _ = log_probs(net, c + x)
            sums.append(sum(lp[-len(x):]))  # only the continuation's tokens count
        acc += int(np.argmax(sums)) == q["gold"]
        acc_norm += int(np.argmax([s / len(cont.encode()) for s, (_, cont) in zip(sums, q["requests"])])) == q["gold"]
        assert [s for s, _ in got[:len(sums)]] == pytest.approx(sums, abs=1e-4)
        got = got[len(sums):]
    res = E.mc_accuracy(net, tok, questions, batch_size=4)
    assert res == {"acc": acc / 6, "acc_norm": acc_norm / 6, "n": 6}


def test_greedy_hit_and_recovery_through_the_command_line(tmp_path, capsys):
    mixers = pytest.importorskip("mixers")
    t_ckpt, s_ckpt = str(tmp_path / "t.pt"), str(tmp_path / "s.pt")
    checkpoint.save(t_ckpt, tiny(3, vocab=49152))  # real vocabulary: the tasks use the real tokenizer
    checkpoint.save(s_ckpt, checkpoint.student_from_teacher(tiny(4, vocab=49152), "gla"))
    np.random.default_rng(0).integers(17, 49152, 2000).astype(np.uint16).tofile(tmp_path / "val.bin")
    task = [{"id": i, "requests": [[f"Question {i}: pick one\nAnswer:", " yes"], [f"Question {i}: pick one\nAnswer:", " no"]], "gold": i % 2} for i in range(6)]
    (tmp_path / "toy.jsonl").write_text("".join(json.dumps(q) + "\n" for q in task))
    res = E.main([f"--init_from={s_ckpt}", f"--teacher={t_ckpt}", f"--data={tmp_path / 'val.bin'}", "--seq_len=32",
                  "--max_windows=2", "--tasks=toy", f"--mc_dir={tmp_path}", f"--out={tmp_path / 'r.json'}", "--batch_size=4"])
    out = capsys.readouterr().out
    m, t = res["model"]["toy"], res["teacher"]["toy"]
    assert m["n"] == t["n"] == 6 and "recovery" in out and "KL to teacher" in out
    if t["acc_norm"] > 0:
        assert m["recovery"] == pytest.approx(m["acc_norm"] / t["acc_norm"])
    assert res["model"]["lm"]["kl"] > 0 and "kl" not in res["teacher"]["lm"]
    assert json.loads((tmp_path / "r.json").read_text())["model"]["toy"]["acc"] == m["acc"]
    # LAMBADA-style task (one continuation): a hit when greedy decoding reproduces it
    ctx = "abc"
    with torch.no_grad():
        x = CharTok().encode(ctx)
        for _ in range(3):
            x.append(int(tiny(2)(torch.tensor([x]))[0, -1].argmax()))
    inv = {1 + i: chr(i) for i in range(V - 1)}
    cont = "".join(inv[i] for i in x[3:])
    assert E.loglikelihoods(tiny(2), CharTok(), [(ctx, cont)])[0][1] is True
    assert E.mc_accuracy(tiny(2), CharTok(), [{"requests": [(ctx, cont)], "gold": 0}])["acc"] == 1.0


def test_missing_task_files_stop_before_any_work(tmp_path):
    # a one-line message naming the command that prepares them, before the model is even loaded
    with pytest.raises(SystemExit) as e:
        E.main(["--init_from=NOWHERE.pt", f"--mc_dir={tmp_path}", "--tasks=arc_easy,piqa"])
    assert "has no arc_easy, piqa" in e.value.code and "python data/mc_offline/prepare.py" in e.value.code
