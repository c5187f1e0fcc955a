"""Long-context distillation (reproduce.py --long_context, report.py's comparison): a run keyed
apart from its baseline that trains stage 3's last steps longer, or only those from its
baseline's checkpoint, to the bit the same; bad settings refused in one line; and the report's
pairs, intervals, verdict and figure."""

import argparse
import json
import os

import pytest

from reproduce_calls import refused, run  # first: it puts scripts/ on the path
import report
import reproduce


LONG_LENGTHS = (512, 1024, 2048, 4096, 8192)


def niah_run(name, mixer, passkey, samples=10, long=0, tokens=100_000_000, sft=True, **settings):
    """A run as reproduce.py writes it, with NIAH_LONG's lengths: the passkey (and the UUID a tenth
    lower) by length, the same after stage 3 and after SFT (after SFT: its NIAH left out when not sft)."""
    def m(key):
        return {"eval": {"model": {"lm": {"ppl": 8.0, "kl": 0.3 if long else 0.4}}, "teacher": {},
                         "summary": {"recovery": {"avg": [0.9, 0.88, 0.92]}}},
                "niah": {"s_niah_1": {str(L): a for L, a in zip(LONG_LENGTHS, key)},
                         "s_niah_3": {str(L): max(0.0, a - 0.1) for L, a in zip(LONG_LENGTHS, key)}}}
    s = {"mixer": mixer, "softmax_layers": "", "tokens": tokens, "tokens_per_step": 32768, "sft_tokens_per_step": 32768,
         "stage_tokens": {"1": tokens // 37, "2": 2 * tokens // 37, "3": tokens - 3 * (tokens // 37), "sft": tokens // 10},
         "text": "data/modern", "chat": "data/sharegpt", "extra": "",
         "niah": reproduce.NIAH_LONG.replace("--samples=10", f"--samples={samples}"), **settings}
    if long:
        s.update(long_context=long, long_frac=0.25)
    run = {"name": name, "machine": "m", "date": "2026-12-05", "commit": "c0ffee", "command": "python scripts/reproduce.py",
           "settings": s, "after_stage3": m(passkey), "after_sft": m(passkey)}
    if not sft:
        run["after_sft"]["niah"] = {}
    return run


def pair(mixer, base, long, **kw):
    """A baseline and its long-context run at 2048, passkeys by length (LONG_LENGTHS)."""
    return {mixer: niah_run(mixer, mixer, base, **kw), f"{mixer}_long2048": niah_run(f"{mixer}_long2048", mixer, long,
                                                                                      long=2048, **kw)}


ZERO = (0.0,) * 5
GDN = (0.82, 0.66, 0.26, 0.18, 0.1)  # Gated DeltaNet after SFT here, and a guess at 8k


def test_long_context_runs_are_keyed_apart_from_their_baselines():
    def ns(**kw):
        return argparse.Namespace(**{**dict(teacher=False, name="", mixer="gated_deltanet", long_context=0,
                                            long_frac=reproduce.LONG_FRAC, long_niah=False), **kw})

    assert reproduce.run_name(ns()) == "gated_deltanet" and reproduce.run_name(ns(long_niah=True)) == "gated_deltanet"
    assert reproduce.run_name(ns(long_context=2048)) == "gated_deltanet_long2048"
    assert reproduce.run_name(ns(long_context=4096, long_frac=0.5, name="hybrid")) == "hybrid_long4096_frac0.5"
    assert reproduce.run_name(ns(teacher=True)) == "teacher"
    assert reproduce.run_name(ns(teacher=True, long_niah=True)) == reproduce.run_name(ns(teacher=True, long_context=2048)) \
        == "teacher_long"
    assert reproduce.NIAH_LONG.split()[1] == "--lengths=512,1024,2048,4096,8192"
    assert reproduce.NIAH_LONG.replace(",8192", "") == reproduce.NIAH  # the same prompts, one length more
    assert report.label("gated_deltanet_long2048", niah_run("x", "gated_deltanet", GDN, long=2048)) == \
        "Gated DeltaNet, last 25% of stage 3 at 2048"


def test_a_long_context_run_is_set_beside_the_baseline_it_started_from():
    # two runs of the same recipe: the one the long run extends by name, else the one it branched from
    runs = {"gated_deltanet_rerun": niah_run("gated_deltanet_rerun", "gated_deltanet", ZERO),
            **pair("gated_deltanet", GDN, GDN)}
    assert report.long_pairs(runs)[0][:2] == ("gated_deltanet_long2048", "gated_deltanet")
    runs["gated_deltanet_long2048"]["branched_from"] = {"run": "gated_deltanet_rerun", "stage3_step": 2106}
    assert report.long_pairs(runs)[0][:2] == ("gated_deltanet_long2048", "gated_deltanet_rerun")
    runs["gated_deltanet_long2048"]["branched_from"]["run"] = "gone"  # not among the results: by name
    assert report.long_pairs(runs)[0][:2] == ("gated_deltanet_long2048", "gated_deltanet")
    del runs["gated_deltanet"]  # no such name either: any run of the same recipe
    assert report.long_pairs(runs)[0][:2] == ("gated_deltanet_long2048", "gated_deltanet_rerun")
    runs["gated_deltanet_rerun"]["settings"]["tokens"] = 50_000_000  # another budget: none
    assert report.long_pairs(runs) == []


def test_bad_long_context_settings_stop_in_one_line_before_any_step(tiny_inputs, tmp_path):
    d, args = tiny_inputs
    fresh = [a for a in args if not a.startswith(("--work", "--results"))] + [f"--work={tmp_path}", f"--results={tmp_path}"]
    for bad, says in ((["--long_context=96"], "reproduce.py: --long_context=96: --long_block_size=96 does not divide the 64 "
                                              "tokens of a micro-step"),
                      (["--long_context=-1"], "reproduce.py: --long_context=-1: expected a sequence length (0: off)"),
                      (["--long_frac=0.5"], "reproduce.py: --long_frac: a share of stage 3 at --long_context, which is not given"),
                      (["--extra=--long_block_size=128"], "reproduce.py: --extra: --long_block_size is reproduce.py's "
                                                          "own setting (--long_context, --long_frac)")):
        said = refused([a for a in fresh if not (bad[0].startswith("--extra") and a.startswith("--extra"))] + bad)
        assert said.startswith(says), (bad, said)
        assert not os.listdir(tmp_path)  # refused before any step


def test_a_long_context_run_trains_its_last_steps_longer_and_keeps_its_own_json(tiny_inputs, tmp_path):
    # on the tiny run's data and teacher: stage 3's last half at 128 tokens, 1 x 128 a micro-step
    # as the other steps' 2 x 64; the run gets its own name, folder and JSON, and records the setting
    d, args = tiny_inputs
    extra = [a for a in args if a.startswith("--extra=")][0].replace("--batch_size=1", "--batch_size=2")
    rest = [a for a in args if not a.startswith(("--extra=", "--maturity", "--sft_kd", "--work", "--results"))]
    proc = run(rest + [extra, "--maturity=", "--long_context=128", "--long_frac=0.5", f"--work={tmp_path / 'work'}",
                       f"--results={tmp_path}"], timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    r = json.load(open(tmp_path / "gla_long128_frac0.5.json"))
    s = r["settings"]
    assert r["name"] == "gla_long128_frac0.5" and s["long_context"] == 128 and s["long_frac"] == 0.5
    log = open(tmp_path / "work" / "gla_long128_frac0.5" / "stage3.log").read()
    n = s["steps"]["3"]
    assert "--long_block_size=128" in log and f"step {n - round(n / 2)}: sequences of 128 tokens from here, 1 a micro-step" in log
    for other in ("stage1", "stage2", "stagesft"):  # the rest of the recipe as the baseline's
        assert "sequences of" not in open(tmp_path / "work" / "gla_long128_frac0.5" / f"{other}.log").read()
    assert s["tokens_per_step"] == 128 and r["after_sft"]["niah"]["s_niah_1"]
    assert not os.path.exists(tmp_path / "gla.json") and "branched_from" not in r
    # after its baseline (--long_niah, the same recipe, the same --work) the same command starts at the
    # switch, from the baseline's files, and ends where the run from the start did, to the bit
    work, k = tmp_path / "after_baseline", n - round(n / 2)
    for what in ("--long_niah", "--long_context=128"):
        proc = run(rest + [extra, "--maturity=", what, "--long_frac=0.5", f"--work={work}", f"--results={work}"],
                   timeout=900)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    b = json.load(open(work / "gla_long128_frac0.5.json"))
    assert b["branched_from"] == {"run": "gla", "stage3_step": k} and b["seconds"]["stage1"] == b["seconds"]["stage2"] == 0
    assert b["history"] == r["history"]  # every stage's curves: stage 3's the baseline's up to the switch
    assert b["after_stage3"]["eval"]["model"] == r["after_stage3"]["eval"]["model"]
    assert b["after_sft"]["eval"]["model"] == r["after_sft"]["eval"]["model"]
    mine = open(work / "gla_long128_frac0.5" / "stage3.log").read()
    assert "step 10/" in log and "step 10/" not in mine and f"step {k}: sequences of 128 tokens from here" in mine
    assert os.path.samefile(work / "gla" / "gla" / "stage2.pt", work / "gla_long128_frac0.5" / "gla" / "stage2.pt")
    assert os.path.exists(work / "gla" / "gla" / f"stage3_branch{n - round(n / 4)}.pt")  # a last quarter's start too
    assert not [f for f in os.listdir(work / "gla_long128_frac0.5" / "gla") if "branch" in f]  # not the baseline's settings


def test_intervals_of_niah_accuracies_and_of_their_gains_by_hand():
    assert report.prompts({"settings": {"niah": reproduce.NIAH}}) == 50  # 5 depths x 10 samples
    assert report.prompts({"settings": {"niah": "--depths=50 --samples=3"}}) == 3
    assert report.prompts({"settings": {"niah": "--full --depths=0,100"}}) == 60 and report.prompts({}) == 5
    assert report.niah_interval(0.5, 100) == pytest.approx([0.5, 0.40383, 0.59617], abs=5e-5)  # Wilson's
    assert report.niah_interval(0.0, 10) == pytest.approx([0.0, 0.0, 0.27753], abs=5e-5)
    # Newcombe's difference: the distance of each end from its value, the two added in quadrature
    a, b = [0.5, 0.4, 0.6], [0.8, 0.7, 0.85]
    assert report.gain(a, b) == pytest.approx([0.3, 0.3 - (0.1 ** 2 + 0.1 ** 2) ** 0.5, 0.3 + (0.05 ** 2 + 0.1 ** 2) ** 0.5])
    lo, hi = report.gain(report.niah_interval(0, 50), report.niah_interval(0, 50))[1:]
    assert lo == -hi and 0.07 < hi < report.PASSKEY_MOVES  # nothing found twice in 50 prompts: no move of 10 points


def verdict(runs):
    got = report.long_verdict(runs, report.long_pairs(runs))
    assert got.startswith("- Retrieval past the training length") and "\n" not in got
    return got


def test_the_long_context_verdict_follows_its_rule():
    # follows: a non-delta-rule student's passkey gain at 2048 wholly above 0 (0 -> 40% of 50 prompts)
    runs = {**pair("gated_deltanet", GDN, GDN), **pair("gla", ZERO, (0.1, 0.0, 0.4, 0.0, 0.0))}
    got = verdict(runs)
    assert ": retrieval follows the training length (GLA: a gain whose interval lies above 0)." in got
    assert "GLA, last 25% of stage 3 at 2048 (after SFT): 2048 +40 [+26, +54], 4096 +0 [-7, +7], 8192 +0 [-7, +7]" in got
    assert "Gated DeltaNet, last 25% of stage 3 at 2048 (after SFT): 2048 +0 [" in got
    # bounded: the non-delta student finds nothing either way (no move of 10 points fits its
    # intervals), the delta rule's moves or does not
    runs.update(pair("gla", ZERO, ZERO))
    assert ": retrieval is bounded by the state (long sequences do not move the passkey)." in verdict(runs)
    runs.update(pair("gated_deltanet", GDN, (0.82, 0.7, 0.8, 0.6, 0.3)))
    assert ": retrieval is bounded by the state (long sequences move the passkey only for the delta rule: " \
           "Gated DeltaNet)." in verdict(runs)
    # not settled: GLA's 5 -> 8 of 50 at 2048 takes in 0 and 10 points alike
    runs.update(pair("gla", (0.1,) * 5, (0.1, 0.1, 0.16, 0.1, 0.1)))
    assert ": not settled (the intervals of GLA take in both 0 and a gain of 10 points)." in verdict(runs)
    # the delta rule alone measured: its move cannot tell the state from the recipe
    del runs["gla"], runs["gla_long2048"]
    assert ": not settled (only delta-rule students measured, and long sequences move the passkey of Gated " \
           "DeltaNet: a student of another rule tells the state from the recipe)." in verdict(runs)
    runs.update(pair("gated_deltanet", GDN, GDN))  # unmoved, but 50 prompts a length cannot rule out 10 points
    assert ": not settled (the intervals of Gated DeltaNet take in both" in verdict(runs)
    runs.update(pair("gated_deltanet", GDN, GDN, samples=200))  # 1,000 prompts a length can
    assert ": retrieval is bounded by the state (long sequences do not move the passkey, even of the delta rule)." \
        in verdict(runs)
    # a pair whose NIAH after SFT did not finish is judged after stage 3, and says so
    runs.update(pair("gla", ZERO, ZERO, sft=False))
    got = verdict(runs)
    assert ": retrieval is bounded by the state (long sequences do not move the passkey)." in got
    assert "GLA, last 25% of stage 3 at 2048 (after stage 3): 2048 +0" in got
    # hybrids are not judged; a long run without its baseline (other budget) is not paired
    hybrid = pair("gated_deltanet", ZERO, (0.5,) * 5, softmax_layers="5,15,25")
    runs = {"hybrid": hybrid["gated_deltanet"], "hybrid_long2048": hybrid["gated_deltanet_long2048"],
            "gla": niah_run("gla", "gla", ZERO, tokens=10**9), "gla_long2048": niah_run("gla_long2048", "gla", ZERO, long=2048)}
    assert [p[:2] for p in report.long_pairs(runs)] == [("hybrid_long2048", "hybrid")]
    assert verdict(runs).endswith(": not measured (no long-context run of the seven mixers with its baseline's passkey "
                                  "beyond 1024 tokens).")


def test_the_report_sets_long_context_runs_beside_their_baselines_and_draws_them(tmp_path, monkeypatch):
    r = tmp_path / "r"
    r.mkdir()
    runs = {**pair("gated_deltanet", GDN, (0.82, 0.7, 0.8, 0.6, 0.3)), **pair("gla", ZERO, ZERO)}
    runs["gla_long2048"]["branched_from"] = {"run": "gla", "stage3_step": 2106}  # trained the long steps alone
    teacher = {"name": "teacher_long", "machine": "m", "date": "d", "commit": "c", "command": "python scripts/reproduce.py",
               "settings": {"niah": reproduce.NIAH_LONG}, "teacher": niah_run("t", "t", (1.0, 1.0, 1.0, 0.98, 0.9))["after_sft"]}
    for n, run_ in {**runs, "teacher_long": teacher}.items():
        (r / f"{n}.json").write_text(json.dumps(run_))
    panels = []
    real = report.save
    monkeypatch.setattr(report, "save", lambda fig, axes, *a: panels.append(
        [[(ln.get_label(), ln.get_linestyle(), ln.get_color(), list(ln.get_xdata())) for ln in ax.get_lines()]
         for ax in axes]) or real(fig, axes, *a))
    report.main([f"--results={r}", f"--assets={tmp_path / 'assets'}"])
    assert os.path.getsize(tmp_path / "assets" / "study_long.png") > 10_000
    text = (r / "report.md").read_text()
    study, long = text.split("### Long-context distillation")
    assert "at 2048" not in study.split("Runs:")[0] and "teacher_long" not in study  # the study's tables as they were
    assert "| Gated DeltaNet | after SFT | 90.0 [88.0, 92.0] | 0.400 | 82.0 [69.2, 90.2] | 66.0 [52.2, 77.6] | " in long
    assert "| Gated DeltaNet, last 25% of stage 3 at 2048 | after SFT | 90.0 [88.0, 92.0] | 0.300 | 82.0 [69.2, 90.2] |" in long
    assert "| teacher | - | - | 0 | 100.0 [92.9, 100.0] |" in long and "UUID 8192 [95%]" in long
    assert "only Gated DeltaNet keeps a passkey at 2k, 81.8%, falling to 29.8% at 4k after 10B tokens" in long
    assert "![passkey by length, long-context runs against their baselines](../assets/study_long.png)" in long
    assert "only for the delta rule: Gated DeltaNet" in long
    assert "`python scripts/reproduce.py`, started from gla's stage 3 at step 2,106\n" in long
    lines = {name: (ls, colour, xs) for name, ls, colour, xs in panels[-1][1]}  # after SFT
    base, longer = lines["Gated DeltaNet"], lines["Gated DeltaNet, last 25% of stage 3 at 2048"]
    assert base[0] == "--" and longer[0] == "-" and base[1] == longer[1] != lines["GLA"][1]  # a colour a student
    assert base[2] == list(LONG_LENGTHS) and lines["teacher"][1] == "k"
    assert [xs[0] for name, _, _, xs in panels[-1][1] if "training length" in name] == [512, 1024, 2048]
    # no long-context run: one line, no figure
    for n in runs:
        if "_long" in n:
            os.remove(r / f"{n}.json")
    report.main([f"--results={r}", f"--assets={tmp_path / 'none'}"])
    text = (r / "report.md").read_text()
    assert "Not measured: no long-context run (reproduce.py --long_context) with its baseline." in text
    assert ("The teacher at 512 / 1024 / 2048 / 4096 / 8192 tokens (teacher_long): passkey 100 / 100 / 100 / 98 / 90%; "
            "UUID 90 / 90 / 90 / 88 / 80%.") in text  # the teacher's own long NIAH, before any long run
    assert "- teacher, NIAH to 8k: m, d, commit c: " in text
    assert not os.path.exists(tmp_path / "none" / "study_long.png")
