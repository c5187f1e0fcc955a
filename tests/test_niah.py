"""niah.py: RULER's single-needle tasks. Prompts of exact length in RULER's wording with the
needle where it says, each task's own haystack (the noise; the --data file), the string-match
score, the score of a model that copies from its context (1) and of one that guesses (0), and
the missing-corpus error that comes before any model loads."""

import ast
import csv
import glob
import json
import os
import random
import re
import subprocess
import sys
import sysconfig

import numpy as np
import pytest
import torch

import checkpoint
import model as M
import niah

LENGTHS, DEPTHS = (256, 600), (0, 25, 50, 75, 100)
NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."


def held_out_bin(tok, path):
    """A small uint16 token file of real prose in data/modern/val.bin's format (documents ended
    by token 0) that needs no download: ASCII docstrings of the Python standard library, with
    their line breaks and indents."""
    ids = []
    for f in sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py"))):
        doc = ast.get_docstring(ast.parse(open(f, encoding="utf-8").read())) or ""
        if len(doc) > 400 and doc.isascii():
            ids += tok.encode(doc) + [tok.eot_id]
        if len(ids) > 30_000:
            break
    np.array(ids, dtype=np.uint16).tofile(path)
    return str(path)


@pytest.fixture(scope="module")
def data(tok, tmp_path_factory):
    return held_out_bin(tok, tmp_path_factory.mktemp("modern") / "val.bin")


@pytest.fixture(scope="module")
def haystacks(tok, data):
    return {"noise": niah.Haystack.noise(tok), "essay": niah.Haystack.essays(tok, data)}


def tiny_model(seed=0, **kw):
    torch.manual_seed(seed)
    cfg = dict(vocab_size=49152, n_layer=2, n_embd=32, n_head=2, n_kv_head=1, intermediate_size=64)
    return M.SmolLM2(M.Config(**{**cfg, **kw})).eval()


def find(ids, sub):
    """Index of the first occurrence of the list sub in the list ids."""
    return next(i for i in range(len(ids) - len(sub) + 1) if ids[i:i + len(sub)] == sub)


def parts(tok, hay, task, needle, ids, pos):
    """(filler ids, index of the needle in the filler, needle ids) of a prompt."""
    v = niah.TASKS[task][1]
    head = tok.encode(f"A special magic {v} is hidden within the following text. Make sure to "
                      f"memorize it. I will quiz you about the {v} afterwards.\n")
    question = tok.encode(f"\nWhat is the special magic {v} for {needle[0]} mentioned in the provided text?")
    needle_ids = tok.encode(hay.sep + f"One of the special magic {v}s for {needle[0]} is: {needle[1]}.")
    start, end = find(ids, head) + len(head), find(ids, question)
    assert ids[pos:pos + len(needle_ids)] == needle_ids  # the needle is where build_prompt says
    return ids[start:pos] + ids[pos + len(needle_ids):end], pos - start, needle_ids


@pytest.mark.parametrize("chat", [True, False])
@pytest.mark.parametrize("task", list(niah.TASKS))
def test_prompt_has_the_length_and_rulers_wording_and_the_needle_sits_at_its_depth(tok, haystacks, task, chat):
    hay, rng = haystacks[niah.TASKS[task][0]], random.Random(0)
    v = {"s_niah_1": "number", "s_niah_2": "number", "s_niah_3": "uuid"}[task]
    for length in LENGTHS:
        needle = niah.make_needle(task, rng)
        for d in DEPTHS:
            ids, pos = niah.build_prompt(tok, hay, task, needle, length, d, rng, chat)
            assert len(ids) == length
            filler, at, _ = parts(tok, hay, task, needle, ids, pos)
            target = d / 100 * len(filler)
            if hay.lines:  # the noise: the needle is a line of its own, the one nearest to depth%
                assert at == len(filler) or tok.decode(filler[at:at + 1]) == "\n"
                assert abs(at - target) <= len(tok.encode("\n" + NOISE))
            else:  # an essay: after the sentence end nearest to depth%
                ends = [0] + [i + 1 for i, t in enumerate(filler) if hay.ends[t]]
                assert at in ends and abs(at - target) == min(abs(e - target) for e in ends)
        text = tok.decode(ids)
        prefix = f"The special magic {v} for {needle[0]} mentioned in the provided text is"
        question = f"\nWhat is the special magic {v} for {needle[0]} mentioned in the provided text?"
        assert text.endswith(prefix) and (question + " " + prefix in text) == (not chat)
        assert ("<|im_start|>assistant\n" + prefix in text) == chat  # the prefix opens the reply
        assert f"A special magic {v} is hidden within the following text. Make sure to memorize it. " \
               f"I will quiz you about the {v} afterwards.\n" in text


def test_the_needle_goes_after_the_sentence_end_nearest_to_its_depth(tok):
    # 75% of 491 tokens is 368.25: the end at 377 (8.75 away) beats the one at 359 (9.25 away),
    # though the two tie once the target is rounded to 368
    word, stop = tok.encode(" word")[0], tok.encode(".")[0]
    hay = np.full(491, word)
    hay[[358, 376]] = stop
    essay = niah.Haystack(tok, hay)
    assert not essay.ends[word] and essay.ends[stop]
    assert essay.insert_at(hay, 75) == 377
    assert essay.insert_at(hay, 0) == 0 and essay.insert_at(hay, 100) == 491


def test_needles_are_rulers_key_and_value_types():
    rng = random.Random(0)
    for task, value in [("s_niah_1", r"\d{7}"), ("s_niah_2", r"\d{7}"),
                        ("s_niah_3", r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")]:
        keys = set()
        for _ in range(50):
            key, v = niah.make_needle(task, rng)
            assert re.fullmatch(r"[a-z]+-[a-z]+", key) and re.fullmatch(value, v)
            keys.add(key)
        assert len(keys) > 40  # adjective-noun pairs: few repeats


def test_s_niah_1_haystack_is_the_noise_line_after_line(tok, haystacks):
    rng = random.Random(2)
    needle = niah.make_needle("s_niah_1", rng)
    ids, pos = niah.build_prompt(tok, haystacks["noise"], "s_niah_1", needle, 1000, 40, rng)
    text = tok.decode(ids)
    hay = text[text.index("afterwards.\n") + len("afterwards.\n"):text.index("\nWhat is the special")]
    lines = hay.split("\n")
    needle_line = f"One of the special magic numbers for {needle[0]} is: {needle[1]}."
    assert lines.count(needle_line) == 1 and NOISE.endswith(lines[0]) and lines[0]  # cut from the front only
    rest = [s for s in lines[1:] if s != needle_line]
    assert len(rest) > 30 and all(s == NOISE for s in rest)


def test_essay_haystacks_come_from_the_data_file_in_different_windows(tok, haystacks, data):
    ids = np.fromfile(data, dtype=np.uint16).tolist()
    docs = tok.decode(ids).split("<|endoftext|>")
    source = " ".join(" ".join(d.split()) for d in docs if d)  # whitespace collapsed, as RULER's essays
    assert "\n" in tok.decode(ids) and len(docs) > 10
    rng, seen = random.Random(3), set()
    for task in ("s_niah_2", "s_niah_3"):
        for _ in range(3):
            needle = niah.make_needle(task, rng)
            prompt, pos = niah.build_prompt(tok, haystacks["essay"], task, needle, 700, 50, rng)
            filler, _, _ = parts(tok, haystacks["essay"], task, needle, prompt, pos)
            assert len(filler) > 500 and tok.decode(filler) in source
            assert "The grass is green" not in tok.decode(filler)
            seen.add(tuple(filler[:20]))
    assert len(seen) == 6  # a random window for each prompt


def test_essay_filler_does_not_repeat_and_ends_on_a_sentence_end(tok, haystacks):
    hay = haystacks["essay"]
    assert len(hay.ids) > 10_000 and not np.isin(hay.ids, list(tok.special.values())).any()
    filler = hay.sample(2000, random.Random(1))
    assert len(filler) == 2000 and hay.ends[filler[-1]]
    grams = {tuple(filler[i:i + 12]) for i in range(len(filler) - 12)}
    assert len(grams) > 0.9 * (len(filler) - 12)  # held-out prose, not a loop (the noise has 25)


@pytest.mark.parametrize("pred, value, ok", [
    (" 7143215.", "7143215", True), ("**7143215**", "7143215", True), (": it is 7143215, I think", "7143215", True),
    ("\n'7143215'\n", "7143215", True), (" 71432150", "7143215", True),  # RULER: the value occurs, no more
    (" 714321", "7143215", False), (" 7143 215", "7143215", False), ("", "7143215", False),
    (" E9BB17BC-a3f2-49bf-9c63-16b950f24455.", "e9bb17bc-a3f2-49bf-9c63-16b950f24455", True),
    (" e9bb17bc-a3f2-49bf-9c63-16b950f2445", "e9bb17bc-a3f2-49bf-9c63-16b950f24455", False),
])
def test_string_match_is_rulers_niah_metric(pred, value, ok):
    assert niah.string_match(pred, value) is ok


def test_a_copying_model_scores_one_and_a_guessing_model_zero(tok, haystacks):
    def copier(prompts, max_new):  # finds the needle's value in its context, as retrieval should
        pat = r"special magic \w+ for [a-z-]+ is: ([0-9a-f-]+)\."
        return [" " + re.search(pat, tok.decode(p)).group(1) + "." for p in prompts]

    gen = torch.Generator().manual_seed(0)

    def guesser(prompts, max_new):
        return [tok.decode(torch.randint(17, 49152, (max_new,), generator=gen).tolist()) for _ in prompts]

    args = (tok, haystacks, list(niah.TASKS), [256, 512], list(DEPTHS), 2)
    copied, guessed = niah.run(copier, *args, batch_size=3), niah.run(guesser, *args, batch_size=3)
    assert len(copied) == len(guessed) == 3 * 2 * 5 * 2
    assert {r["task"] for r in copied} == set(niah.TASKS)
    assert all(v == 1.0 for v in niah.summarize(copied).values())
    assert all(v == 0.0 for v in niah.summarize(guessed).values())


@pytest.mark.parametrize("mixer", [None, "gated_deltanet"])
def test_cached_greedy_answer_equals_rereading_the_prompt(mixer):
    net = tiny_model()
    if mixer:
        pytest.importorskip("mixers")
        net = checkpoint.student_from_teacher(net, mixer).eval()
    idx = torch.randint(17, 49152, (2, 70), generator=torch.Generator().manual_seed(0))
    got = niah.greedy(net, idx, 5)  # prefill (KV cache or chunked form -> state), then steps
    x = idx
    with torch.no_grad():
        for _ in range(5):  # no cache: the whole sequence again for every token
            x = torch.cat([x, net(x)[:, -1].argmax(-1, keepdim=True)], 1)
    assert torch.equal(got, x[:, 70:])


def test_command_line_writes_tables_predictions_and_heatmap(tmp_path, data, capsys):
    ckpt = str(tmp_path / "tiny.pt")
    checkpoint.save(ckpt, tiny_model())
    acc = niah.main([f"--init_from={ckpt}", "--tasks=s_niah_1,s_niah_3", f"--data={data}", "--lengths=160",
                     "--depths=0,100", f"--out_dir={tmp_path}", "--batch_size=3", "--samples=2"])
    out = capsys.readouterr().out
    assert "S-NIAH-1: noise haystack, 7-digit value (the study's passkey)" in out and "S-NIAH-3" in out
    assert "S-NIAH-2" not in out and out.count("| 100% |") == 2
    res = json.loads((tmp_path / "results.json").read_text())
    recs = res["records"]
    assert len(recs) == 8 and {r["task"] for r in recs} == {"s_niah_1", "s_niah_3"}
    assert acc[("s_niah_1", 160, "all")] == sum(r["correct"] for r in recs if r["task"] == "s_niah_1") / 4
    rows = list(csv.DictReader(open(tmp_path / "results.csv", newline="")))
    assert [(r["task"], r["value"], r["prediction"]) for r in rows] == [(r["task"], r["value"], r["prediction"]) for r in recs]
    assert all(r["correct"] == str(niah.string_match(r["prediction"], r["value"])) for r in rows)
    assert (tmp_path / "heatmap.png").read_bytes()[:4] == b"\x89PNG"


class Loaded(Exception):
    pass


def test_a_missing_corpus_stops_an_essay_task_before_any_model_loads(tmp_path, monkeypatch):
    def load(args):
        raise Loaded

    monkeypatch.setattr(niah.checkpoint, "load_from_settings", load)
    missing = str(tmp_path / "val.bin")
    for task in ("s_niah_2", "s_niah_3"):
        with pytest.raises(SystemExit) as e:
            niah.main([f"--tasks=s_niah_1,{task}", f"--data={missing}"])
        assert missing in e.value.code and "python data/modern/prepare.py" in e.value.code
    with pytest.raises(Loaded):  # the noise needs no corpus
        niah.main(["--tasks=s_niah_1", f"--data={missing}"])


def test_a_missing_corpus_is_a_one_line_error(tmp_path):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run([sys.executable, os.path.join(root, "niah.py"), f"--data={tmp_path}/val.bin"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("error:") and "data/modern/prepare.py" in r.stderr


@pytest.mark.parametrize("bad, named", [("--lengths=512,abc", "--lengths"), ("--depths=0,half", "--depths"),
                                        ("--lengths=64", "lengths >= 128"), ("--tasks=s_niah_1,passkey", "--tasks")])
def test_bad_settings_stop_with_a_message(bad, named, capsys):
    with pytest.raises(SystemExit):
        niah.settings([bad])
    err = capsys.readouterr().err
    assert "error:" in err and named in err
