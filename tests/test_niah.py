"""niah.py: prompts of exact length with the needle where it says, answer matching, and the
score of a model that copies from its context (1) and of one that guesses (0)."""

import json
import os
import random
import re

import pytest
import torch

import checkpoint
import model as M
import niah

LENGTHS, DEPTHS = (256, 600), (0, 25, 50, 75, 100)


@pytest.fixture(scope="module")
def grass(tok):
    return niah.Haystack(tok, "grass")


def tiny_model(seed=0, **kw):
    torch.manual_seed(seed)
    cfg = dict(vocab_size=49152, n_layer=2, n_embd=32, n_head=2, n_kv_head=1, intermediate_size=64)
    return M.SmolLM2(M.Config(**{**cfg, **kw})).eval()


@pytest.mark.parametrize("chat", [True, False])
def test_prompt_has_the_length_and_the_needle_sits_at_its_depth(tok, grass, chat):
    rng = random.Random(0)
    for length in LENGTHS:
        for kind in niah.NEEDLES:
            needle = niah.make_needle(kind, rng)
            got = {d: niah.build_prompt(tok, grass, needle, length, d, rng, chat) for d in DEPTHS}
            needle_ids = tok.encode(niah.NEEDLES[kind][0].format(key=needle[1], value=needle[2]))
            first, last = got[0][1], got[100][1]  # haystack start, and its end minus nothing
            for d, (ids, pos, value) in got.items():
                assert len(ids) == length and value == needle[2]
                assert ids[pos:pos + len(needle_ids)] == needle_ids  # the needle is where it says
                assert abs(pos - (first + d / 100 * (last - first))) <= 8  # grass sentences: <= 7 tokens
            text = tok.decode(got[100][0])
            assert text.rstrip().endswith(niah.NEEDLES[kind][2].format(key=needle[1]))  # answer prefix last
            assert ("<|im_start|>assistant" in text) == chat


def held_out_bin(tok, path):
    """A small uint16 token file of real prose, like data/offline/val.bin, that needs no download:
    docstrings of the Python standard library, one document each."""
    import ast
    import glob
    import sysconfig

    import numpy as np

    ids = []
    for f in sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "*.py"))):
        doc = ast.get_docstring(ast.parse(open(f, encoding="utf-8").read())) or ""
        if len(doc) > 400:
            ids += tok.encode(" ".join(doc.split())) + [tok.eot_id]  # prose: whitespace runs collapsed
        if len(ids) > 30_000:
            break
    np.array(ids, dtype=np.uint16).tofile(path)
    return str(path)


def test_offline_filler_does_not_repeat_and_needles_follow_sentence_ends(tok, tmp_path):
    hay = niah.Haystack(tok, "offline", held_out_bin(tok, tmp_path / "val.bin"))
    assert len(hay.ids) > 10_000
    rng = random.Random(1)
    filler = hay.sample(2000, rng)
    assert hay.ends[filler[-1]]  # windows end on a sentence end
    grams = {tuple(filler[i:i + 12]) for i in range(len(filler) - 12)}
    assert len(grams) > 0.99 * (len(filler) - 12)  # held-out prose, not a loop
    for d in DEPTHS:
        at = hay.insert_at(filler, d)
        assert at in (0, len(filler)) or hay.ends[filler[at - 1]]


@pytest.mark.parametrize("pred, value, ok", [
    (" 71432.", "71432", True), ("**71432**", "71432", True), (": 71432 is the pass key", "71432", True),
    ("\n'71432'\n", "71432", True), (" 714320", "71432", False), (" 7143", "71432", False), ("", "71432", False),
    (" The pass key is 71432", "71432", False),  # the prefix is in the prompt: the answer comes first
    (" E9BB17BC-a3f2-49bf-9c63-16b950f24455.", "e9bb17bc-a3f2-49bf-9c63-16b950f24455", True),
    (" e9bb17bc-a3f2-49bf-9c63-16b950f2445", "e9bb17bc-a3f2-49bf-9c63-16b950f24455", False),
])
def test_exact_match_normalization(pred, value, ok):
    assert niah.exact_match(pred, value) is ok


def test_a_copying_model_scores_one_and_a_guessing_model_zero(tok, grass):
    def copier(prompts, max_new):  # finds the needle's value in its context, as retrieval should
        return [" " + re.search(r"(?:pass key is|is:) ([0-9a-f-]+)", tok.decode(p)).group(1) + "." for p in prompts]

    gen = torch.Generator().manual_seed(0)

    def guesser(prompts, max_new):
        return [tok.decode(torch.randint(17, 49152, (max_new,), generator=gen).tolist()) for _ in prompts]

    args = (tok, grass, [256, 512], list(DEPTHS), list(niah.NEEDLES), 2)
    copied, guessed = niah.run(copier, *args, batch_size=3), niah.run(guesser, *args, batch_size=3)
    assert len(copied) == len(guessed) == 2 * 5 * 2
    assert all(v == 1.0 for v in niah.summarize(copied).values())
    assert all(v == 0.0 for v in niah.summarize(guessed).values())


@pytest.mark.parametrize("mixer", [None, "gated_deltanet"])
def test_cached_greedy_answer_equals_rereading_the_prompt(mixer):
    net = tiny_model()
    if mixer:
        mixers = pytest.importorskip("mixers")
        net = checkpoint.student_from_teacher(net, mixer).eval()
    idx = torch.randint(17, 49152, (2, 70), generator=torch.Generator().manual_seed(0))
    got = niah.greedy(net, idx, 5)  # prefill (KV cache or chunked form -> state), then steps
    x = idx
    with torch.no_grad():
        for _ in range(5):  # no cache: the whole sequence again for every token
            x = torch.cat([x, net(x)[:, -1].argmax(-1, keepdim=True)], 1)
    assert torch.equal(got, x[:, 70:])


def test_command_line_writes_table_json_csv_and_heatmap(tmp_path, capsys):
    ckpt = str(tmp_path / "tiny.pt")
    checkpoint.save(ckpt, tiny_model())
    acc = niah.main([f"--init_from={ckpt}", "--lengths=160", "--depths=0,100", "--filler=grass",
                     f"--out_dir={tmp_path}", "--batch_size=2", "--samples=3"])
    out = capsys.readouterr().out
    assert "| 100% |" in out and "| uuid |" in out
    res = json.loads((tmp_path / "results.json").read_text())
    assert len(res["records"]) == 6 and {r["kind"] for r in res["records"]} == set(niah.NEEDLES)
    assert acc[(160, "all", "all")] == sum(r["correct"] for r in res["records"]) / 6
    assert (tmp_path / "results.csv").read_text().startswith("length,depth,kind,accuracy")
    assert (tmp_path / "heatmap.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("bad, named", [("--lengths=512,abc", "--lengths"), ("--depths=0,half", "--depths"),
                                        ("--lengths=64", "lengths >= 128"), ("--kinds=passkey,pin", "kinds")])
def test_bad_settings_stop_with_a_message(bad, named, capsys):
    with pytest.raises(SystemExit):
        niah.get_args([bad])
    err = capsys.readouterr().err
    assert "error:" in err and named in err
