"""scripts/reproduce.py and scripts/report.py: the study's split of the budget; one tiny run end
to end on the real teacher (stages 1 -> 3, SFT, both evaluations, one JSON) that a second call
finds done and that other settings refuse; the report built from it; the study's findings
judged from the numbers. Long-context distillation is tests/test_long_context.py."""

import argparse
import json
import os
import shutil
import sys

import pytest

from reproduce_calls import refused, run  # first: it puts scripts/ on the path
import report
import reproduce


def test_budget_splits_as_the_study_and_counts_read_like_people_write_them():
    assert reproduce.tokens("100M") == 100_000_000 and reproduce.tokens("2.5B") == 2_500_000_000
    assert reproduce.tokens("60k") == 60_000 and reproduce.tokens("1234") == 1234
    parts = reproduce.split(3_000_000_000)  # the study's own budget: 80M + 160M + 2.76B
    assert parts == {"1": 80_000_000, "2": 160_000_000, "3": 2_760_000_000}
    parts = reproduce.split(100_000_000)
    assert abs(sum(parts.values()) - 100_000_000) <= 2 and abs(parts["2"] - 2 * parts["1"]) <= 1
    for bad in ("lots", "-5M", "0"):
        with pytest.raises(Exception):
            reproduce.tokens(bad)


def test_the_sliding_window_holds_as_much_as_a_linear_students_state():
    import model as M

    c = M.Config()  # SmolLM2-135M: keys and values of its KV heads against each head's Dk x Dv state
    assert c.n_kv_head * reproduce.SWA_WINDOW * 2 * c.head_dim == c.n_head * c.head_dim * c.head_dim


@pytest.fixture(scope="module")
def tiny(tiny_inputs):
    """One whole run on tiny_inputs, a few steps a stage."""
    d, args = tiny_inputs
    proc = run(args, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    return d, args, json.load(open(d / "results" / "gla.json"))


def test_all_runs_each_student_and_the_teacher_in_its_own_process(tiny):
    # on the tiny run's own folders: its student, in a process of its own, finds every step done
    # (the fixture ran them), and the teacher goes through both evaluations
    d, args, first = tiny
    rest = [a for a in args if not a.startswith("--mixer")]
    proc = run(rest + ["--all", "--runs=gla,teacher"], timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "gla: finished" in proc.stdout and "teacher: finished" in proc.stdout
    assert open(d / "work" / "gla.out").read().count(": done (") == 13
    assert json.load(open(d / "results" / "gla.json"))["after_sft"] == first["after_sft"]
    teacher = json.load(open(d / "results" / "teacher.json"))
    assert "kl" not in teacher["teacher"]["eval"]["model"]["lm"] and "s_niah_1" in teacher["teacher"]["niah"]
    assert os.path.getsize(d / "work" / "teacher.out") > 0
    proc = run(rest + ["--all", "--runs=gla,nope"], timeout=60)
    assert proc.returncode == 1 and "'nope' is not one of" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    proc = run(rest + ["--all", "--runs", "gla"], timeout=300)  # --runs and its value apart: the children get neither
    assert proc.returncode == 0 and "gla: finished" in proc.stdout, proc.stdout + proc.stderr


def test_a_run_goes_through_every_stage_and_both_evaluations(tiny):
    _, _, r = tiny
    s = r["settings"]
    assert s["tokens_per_step"] == 64 and s["steps"]["sft"] == s["steps"]["sft_kd"] == 2  # 128 SFT tokens
    # the maturity point: a quarter of the budget, on a step of stage 3, evaluated lightly
    (point, step), = s["maturity"].items()
    before = s["stage_tokens"]["1"] + s["stage_tokens"]["2"]
    assert int(point) == before + step * 64 and abs(int(point) - 1000) <= 32 and 0 < step < s["steps"]["3"]
    m = r["maturity"][point]
    assert m["tokens"] == int(point) and set(m["eval"]["summary"]["recovery"]) >= {"piqa"}
    assert "arc_easy" not in m["eval"]["summary"]["recovery"] and set(m["niah"]["s_niah_1"]) == {"128"}
    assert m["eval"]["model"]["lm"]["ppl"] != r["after_stage3"]["eval"]["model"]["lm"]["ppl"]  # another student
    assert all(abs(s["stage_tokens"][k] - n) <= 32 for k, n in reproduce.split(4000).items())
    assert {k: h["steps"] for k, h in r["history"].items()} == s["steps"]  # every stage ran to its end
    for after in ("after_stage3", "after_sft", "after_sft_kd"):
        ev = r[after]["eval"]
        assert ev["model"]["lm"]["ppl"] > 1 and ev["model"]["lm"]["kl"] > 0
        assert set(ev["summary"]["recovery"]) >= {"arc_easy", "piqa", "avg"}
        assert set(r[after]["niah"]["s_niah_1"]) == {"128"}
    # the teacher's task scores after SFT are read back from the evaluation after stage 3
    d = tiny[0]
    assert r["after_sft"]["eval"]["teacher"] == r["after_stage3"]["eval"]["teacher"]
    assert "task scores from" in open(d / "work" / "gla" / "eval_sft.log").read()
    assert "evaluating the teacher" in open(d / "work" / "gla" / "eval_stage3.log").read()
    # SFT changed the student: its held-out perplexity moved
    assert r["after_sft"]["eval"]["model"]["lm"]["ppl"] != r["after_stage3"]["eval"]["model"]["lm"]["ppl"]
    # instruction-aware distillation started from the same student and trained another way
    assert r["after_sft_kd"]["eval"]["model"]["lm"]["ppl"] != r["after_sft"]["eval"]["model"]["lm"]["ppl"]
    assert "--stage=sft_kd" in open(d / "work" / "gla" / "stagesft_kd.log").read()  # train.py's settings block
    assert set(r["seconds"]) == {"stage1", "stage2", "stage3", "eval_stage3", "niah_stage3", "stagesft",
                                 "eval_sft", "niah_sft", "stagesft_kd", "eval_sft_kd", "niah_sft_kd",
                                 f"eval_mature{point}", f"niah_mature{point}"}
    assert r["commit"] and r["machine"] and r["command"].startswith("python scripts/reproduce.py")
    # where the time went: each step split by its own clock, the parts adding up to its wall time
    table = r["time_table"]
    cols = [c.strip() for c in table[0].strip("|").split("|")]
    rows = {line.split("|")[1].strip(): [float(c) for c in line.strip("|").split("|")[1:]] for line in table[2:]}
    assert set(rows) == set(r["seconds"]) | {"all"} and cols[-2:] == ["process", "total"]
    for name, cells in rows.items():
        assert abs(sum(cells[:-1]) - cells[-1]) <= len(cells), (name, cells)  # rounded to seconds
    stage3 = dict(zip(cols[1:], rows["stage3"]))
    assert stage3["training"] > 0 and stage3["total"] == round(r["seconds"]["stage3"])
    # the same by part of the run, its steps added before rounding
    parts = {line.split("|")[1].strip(): [float(c) for c in line.strip("|").split("|")[1:]] for line in r["time_groups"][2:]}
    assert list(parts) == ["stage 1", "stage 2", "stage 3", "evaluation of stage 3 (tasks, NIAH)",
                           "maturity points (LAMBADA, passkey)", "SFT", "evaluation of SFT (tasks, NIAH)", "sft_kd",
                           "evaluation of sft_kd (tasks, NIAH)", "all"]
    assert parts["all"] == rows["all"] and parts["stage 3"] == rows["stage3"]
    assert parts["evaluation of SFT (tasks, NIAH)"][-1] == round(r["seconds"]["eval_sft"] + r["seconds"]["niah_sft"])
    assert "time: startup" in open(d / "work" / "gla" / "niah_sft.log").read()


def test_a_second_call_finds_every_step_done_and_other_settings_are_refused(tiny):
    d, args, first = tiny
    proc = run(args, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count(": done (") == 13  # no step ran again
    again = json.load(open(d / "results" / "gla.json"))
    assert again["after_sft"] == first["after_sft"] and again["seconds"] == first["seconds"]
    proc = run([a if not a.startswith("--tokens") else "--tokens=8k" for a in args], timeout=300)
    assert proc.returncode == 1 and "holds a run with other settings" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_new_evaluation_settings_rerun_the_evaluations_alone_and_bad_ones_stop_first(tiny, tmp_path):
    d, args, _ = tiny
    niah = [a for a in args if a.startswith("--niah=")][0]
    changed = [a if a != niah else niah.replace("--depths=50", "--depths=25") for a in args]
    proc = run(changed, timeout=300)
    assert proc.returncode == 0, proc.stderr
    # the three NIAH steps with the run's settings rerun; the maturity point's has its own settings
    assert proc.stdout.count(": done (") == 10 and "niah_stage3: " in proc.stdout and "niah_sft_kd: " in proc.stdout
    assert run(args, timeout=300).stdout.count(": done (") == 10  # and back
    fresh = [a for a in args if not a.startswith(("--work", "--results"))] + [f"--work={tmp_path}", f"--results={tmp_path}"]
    for bad, says in (("--niah=--lengths=abc", "niah.py refuses these settings"), ("--extra=\"", "--extra="),
                      ("--extra=--block_size=0", "--block_size=0"), (f"--eval_extra=--mc_dir={d / 'mc'} --max_windows=0", "evaluate.py refuses"),
                      ("--extra=--max_iters=5", "--max_iters is set for each stage"),
                      ("--extra=--branch_at=3", "--branch_at is set for each stage")):
        assert says in refused([a for a in fresh if not a.startswith(bad.split("=")[0] + "=")] + [bad]), bad
        assert not os.path.exists(tmp_path / "gla" / "stage1.log")  # refused before any step
    import checkpoint

    n = checkpoint.read(str(d / "t.pt"))[0].n_layer  # a hybrid's layers are checked against the teacher's
    says = refused([a for a in fresh if not a.startswith("--mixer")] + ["--mixer=gated_deltanet", f"--softmax_layers=0,{n}",
                                                                       "--name=hybrid"])
    assert says == f"reproduce.py: --softmax_layers='0,{n}': the teacher has {n} layers, numbered 0 to {n - 1}"
    assert not os.path.exists(tmp_path / "hybrid.json") and not os.path.exists(tmp_path / "hybrid")
    nowhere = tmp_path / "nowhere.pt"  # a teacher that cannot be read: one line, not a traceback
    says = refused([a for a in fresh if not a.startswith(("--mixer", "--extra"))]
                   + ["--mixer=gated_deltanet", "--softmax_layers=0", "--name=hybrid", f"--extra=--teacher={nowhere}"])
    assert says.startswith(f"reproduce.py: --extra: --teacher={nowhere}: "), says


def test_a_run_cut_short_keeps_its_numbers_and_names_what_is_missing(tiny, tmp_path):
    d, args, first = tiny
    opts = dict(a[2:].split("=", 1) for a in args if "=" in a)
    ns = argparse.Namespace(teacher=False, val=opts["val"], mc_limit=int(opts["mc_limit"]), tasks=opts["tasks"],
                            eval_extra=opts["eval_extra"], niah=opts["niah"], sft_kd=True,
                            maturity_tasks=opts["maturity_tasks"], maturity_niah=opts["maturity_niah"])
    settings = json.load(open(d / "work" / "gla" / "done.json"))["settings"]
    pipe = reproduce.Pipeline(str(d / "work"), "gla", json.load(open(d / "work" / "gla" / "done.json"))["settings"])
    ckpt = {s: str(d / "work" / "gla" / "gla" / f"stage{s}.pt") for s in ("1", "2", "3", "sft", "sft_kd")}
    assert "incomplete" not in first
    del pipe.done["niah_sft"]  # cut inside the last step
    reproduce.write_results(str(tmp_path / "cut.json"), {"name": "gla", "settings": settings}, pipe, ns, ckpt, 0)
    cut = json.load(open(tmp_path / "cut.json"))
    assert cut["incomplete"] == "not run yet: niah_sft"
    assert cut["after_sft"] == {**first["after_sft"], "niah": {}} and cut["after_stage3"] == first["after_stage3"]
    assert cut["history"] == first["history"]
    reproduce.write_results(str(tmp_path / "cut.json"), {"name": "gla", "settings": settings}, pipe, ns, {**ckpt, "sft": str(tmp_path / "gone.pt")}, 0)
    assert set(json.load(open(tmp_path / "cut.json"))["history"]) == {"1", "2", "3", "sft_kd"}  # a folder without sft's
    for step in ("stagesft", "eval_sft", "niah_stage3"):  # cut earlier: less is kept
        del pipe.done[step]
    reproduce.write_results(str(tmp_path / "cut.json"), {"name": "gla", "settings": settings}, pipe, ns, ckpt, 0)
    cut = json.load(open(tmp_path / "cut.json"))
    assert cut["incomplete"] == "not run yet: niah_stage3, stagesft, eval_sft, niah_sft"
    assert "after_sft" not in cut and cut["after_stage3"]["niah"] == {} and set(cut["history"]) == {"1", "2", "3", "sft_kd"}
    pipe.done["eval_stage3"]["key"] = ["--mc_limit=99"]  # evaluated with other settings: not this run's numbers
    reproduce.write_results(str(tmp_path / "cut.json"), {"name": "gla", "settings": settings}, pipe, ns, ckpt, 0)
    assert "after_stage3" not in json.load(open(tmp_path / "cut.json"))


def test_a_killed_step_runs_again_and_the_rest_stays_done(tiny):
    d, args, _ = tiny
    state_path = d / "work" / "gla" / "done.json"
    state = json.load(open(state_path))
    del state["steps"]["niah_sft"]  # as if killed inside the last step
    json.dump(state, open(state_path, "w"))
    proc = run(args, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count(": done (") == 12 and "niah_sft: " in proc.stdout
    assert "niah_sft" in json.load(open(state_path))["steps"]
    assert "incomplete" not in json.load(open(d / "results" / "gla.json"))


def test_a_step_in_this_process_logs_everything_shows_progress_and_reports_its_error(tmp_path, capsys, monkeypatch):
    """A step runs by its script's main() here: the whole output in its log, the progress lines on
    the terminal, its clock read, and a failing step named with the error in one line."""
    pipe = reproduce.Pipeline(str(tmp_path), "run", {})
    with open(tmp_path / "out.log", "w") as f:
        out = reproduce.StepOutput(f)
        out.write("noise\nstep 3/9 [##] loss 1.0\ntime: startup 1.5 s | steps 2.0 s | total 3.5 s\npart")
        out.write("ial\n")
    assert open(tmp_path / "out.log").read().endswith("partial\n")
    assert out.split == {"startup": 1.5, "steps": 2.0, "total": 3.5}
    shown = capsys.readouterr().out
    assert "step 3/9" in shown and "noise" not in shown and "partial" not in shown
    monkeypatch.chdir(tmp_path)  # a step runs from the repository, as its own process would, then comes back
    with pytest.raises(SystemExit) as e:  # niah.py's own one-line error, raised inside the step
        pipe.step("niah_x", [sys.executable, "niah.py", f"--init_from={tmp_path / 'none.pt'}",
                                    "--tasks=s_niah_1", "--lengths=128"])
    assert "step niah_x failed (exit 1)" in str(e.value) and "niah_x.log" in str(e.value)
    assert "none.pt" in open(tmp_path / "run" / "niah_x.log").read()
    assert "niah_x" not in pipe.done and os.getcwd() == str(tmp_path)


def test_the_report_builds_tables_and_plots_from_the_results(tiny, tmp_path):
    d, _, _ = tiny
    report.main([f"--results={d / 'results'}", f"--out={tmp_path / 'report.md'}", f"--assets={tmp_path}"])
    text = open(tmp_path / "report.md").read()
    assert f"| GLA | {report.count(sum(tiny[2]['settings']['stage_tokens'][k] for k in '123'))} |" in text
    assert "passkey 128" in text
    assert "not measured" in text  # one student: no finding can be judged
    assert "No student has been run twice with the same recipe." in text
    spent = sum(json.loads((d / "results" / "gla.json").read_text())["seconds"].values())  # its steps', across resumes
    assert f"`, {spent:,.0f} s in its steps" in text.split("Runs:")[1] and spent > 0
    # where its time went: the time table's columns add up to the seconds its steps took
    row = next(line for line in text.split("### Where each run's time went")[1].splitlines()
               if line.startswith("| GLA (and --sft_kd) | "))
    cells = [c.strip() for c in row.strip("|").split("|")]
    training, fixed, parts, total = float(cells[2].split()[0]), float(cells[3]), cells[4:-1], float(cells[-1])
    assert cells[-1] == f"{spent:.0f}" and abs(training + fixed - total) <= 1 and len(parts) == 6
    assert abs(sum(map(float, parts)) - fixed) <= 3  # each cell rounded
    (d / "results" / "earlier").mkdir()  # its run again, as the earlier run of the same recipe
    try:
        again = json.loads(json.dumps(tiny[2]))
        again["date"], again["after_stage3"]["eval"]["summary"]["recovery"]["avg"] = "2026-01-01", [0.5, 0.4, 0.6]
        (d / "results" / "earlier" / "gla.json").write_text(json.dumps(again))
        report.main([f"--results={d / 'results'}", f"--out={tmp_path / 'report.md'}", f"--assets={tmp_path}"])
    finally:
        shutil.rmtree(d / "results" / "earlier")
    text = open(tmp_path / "report.md").read()
    rec = tiny[2]["after_stage3"]["eval"]["summary"]["recovery"]["avg"][0]
    assert f"| GLA | 2026-01-01, {tiny[2]['date']} | " in text and f"| {100 * (rec - 0.5):+.1f} |" in text
    assert "- GLA (earlier run): " in text and "the largest of 1 student run twice" not in text  # no pair to judge
    for png in ("study_recovery.png", "study_niah.png", "study_loss.png", "study_passkey.png", "study_time.png"):
        assert os.path.getsize(tmp_path / png) > 10_000


def test_a_run_keeps_its_colour_in_every_panel(tiny, tmp_path, monkeypatch):
    # a run whose NIAH after SFT did not finish is missing from those panels; the runs after it
    # must not take the next colour there, or a line reads as another run's
    d, _, r = tiny
    cut = json.loads(json.dumps(r))
    cut["after_sft"]["niah"] = {}
    other = json.loads(json.dumps(r))
    other["after_sft"]["niah"]["s_niah_1"] = {"128": 0.25}
    runs = {"retnet": cut, "gla": r, "deltanet": other}
    panels = []
    real = report.save
    monkeypatch.setattr(report, "save", lambda fig, axes, *a: panels.append(
        [{line.get_label(): line.get_color() for line in ax.get_lines()} for ax in axes]) or real(fig, axes, *a))
    report.plots(runs, str(tmp_path))
    niah = panels[0]  # after stage 3 then after SFT, each task
    sft = niah[len(report.NIAH)]  # the passkey after SFT
    assert "RetNet" in niah[0] and "RetNet" not in sft and "DeltaNet" in sft
    colours = {}
    for panel in niah + panels[1]:
        for name, colour in panel.items():
            assert colours.setdefault(name, colour) == colour, (name, colour, colours)
    assert len(set(colours.values())) == 3


def test_a_time_table_that_does_not_parse_is_left_out(tmp_path):
    good = {"name": "kda", "machine": "1 x GPU, torch", "date": "2026-01-01", "commit": "abc", "settings": {},
            "time_groups": ["| step | start-up and loading | training | process | total |", "|---|---|---|---|---|",
                            "| stage 1 | 2 | 10 | 1 | 13 |", "| all | 2 | 10 | 1 | 13 |"]}
    assert report.time_rows(good)["all"] == {"start-up and loading": 2, "training": 10, "process": 1, "total": 13}
    torn = {**good, "time_groups": good["time_groups"][:3] + ["| all | 2 | 10 | 13 |"]}  # a cell short
    assert report.time_rows(torn) == {} and report.time_rows({}) == {}
    assert report.time_rows({**good, "time_groups": good["time_groups"][:3] + ["| all | 2 | ten | 1 | 13 |"]}) == {}
    lines, path = report.time_section({"kda": torn}, str(tmp_path), str(tmp_path / "report.md"))
    assert path is None and "No run has a time table (reproduce.py writes one into its JSON)." in lines
    lines, path = report.time_section({"kda": good, "gla": torn}, str(tmp_path), str(tmp_path / "report.md"))
    assert "| KDA | 1 x GPU, 2026-01-01, abc | 10 (77%) | 3 | 2 | 1 | 13 |" in lines
    assert not any(line.startswith("| GLA") for line in lines) and os.path.getsize(path) > 5_000
    other = {**good, "time_groups": ["| step | training | compiling (first step) | total |", "|---|---|---|---|",
                                     "| all | 20 | 4 | 24 |"]}  # a table of other columns
    lines, _ = report.time_section({"kda": good, "gla": other}, str(tmp_path), str(tmp_path / "report.md"))
    assert "| KDA | 1 x GPU, 2026-01-01, abc | 10 (77%) | 3 | 2 | 1 | - | 13 |" in lines
    assert "| GLA | 1 x GPU, 2026-01-01, abc | 20 (83%) | 4 | - | - | 4 | 24 |" in lines


def test_rows_beyond_the_seven_name_what_they_are():
    # the hybrid its softmax layers, the sliding-window baseline its window (its state size)
    assert report.label("hybrid", {"settings": {"mixer": "gated_deltanet", "softmax_layers": "5,15,25"}}) == \
        "Gated DeltaNet + softmax layers 5,15,25"
    assert report.label("swa", {"settings": {"mixer": "swa", "window": 96}}) == "SWA, window 96"
    assert report.label("kda", {"settings": {"mixer": "kda", "window": 512}}) == "KDA"


def test_a_recovery_without_a_value_reads_as_a_dash():
    # evaluate.py's recovery is nan where the teacher scored 0 (few questions)
    assert report.pct([float("nan"), 0.0, 1.0]) == "-" and report.pct(None) == "-"
    assert report.pct([0.5, 0.4, 0.6]) == "50.0"


def test_the_report_sets_budgets_side_by_side(tiny, tmp_path):
    d, _, r = tiny
    big = json.loads(json.dumps(r))  # the same run at ten times the budget, with other numbers
    big["settings"]["stage_tokens"] = {k: 10 * n for k, n in r["settings"]["stage_tokens"].items()}
    big["after_sft"]["eval"]["summary"]["recovery"]["avg"] = [0.875, 0.85, 0.9]
    big["after_sft"]["niah"]["s_niah_1"] = {"128": 0.5}
    (tmp_path / "big").mkdir()
    (tmp_path / "big" / "gla.json").write_text(json.dumps(big))
    report.main([f"--results={d / 'results'}", f"--budgets={tmp_path / 'big'}", f"--out={tmp_path / 'report.md'}",
                 f"--assets={tmp_path}"])
    text = open(tmp_path / "report.md").read()
    small, large = (report.count(sum(x["settings"]["stage_tokens"][k] for k in "123")) for x in (r, big))
    assert f"| run | {small}: recovery | {small}: passkey | {large}: recovery | {large}: passkey |" in text
    rec = r["after_sft"]["eval"]["summary"]["recovery"]["avg"][0]
    key = r["after_sft"]["niah"]["s_niah_1"]["128"]
    assert f"| GLA | {100 * rec:.1f} | {100 * key:.0f} | 87.5 | 50 |" in text
    with pytest.raises(SystemExit, match="no student results in"):
        report.main([f"--results={d / 'results'}", f"--budgets={tmp_path / 'none'}", f"--assets={tmp_path}"])


def fake(recovery, passkey):
    """A run as reproduce.py writes it, with just the numbers the findings read."""
    m = {"eval": {"summary": {"recovery": {"avg": [recovery, recovery - 0.02, recovery + 0.02]}}},
         "niah": {"s_niah_1": {str(L): a for L, a in zip((512, 1024, 2048, 4096), passkey)}}}
    return {"after_stage3": m, "after_sft": m}


def test_findings_are_judged_from_the_numbers():
    def judged(runs):  # each with niah.py's settings of a study run: 50 prompts a length
        for r in runs.values():
            r["settings"] = {"niah": "--tasks=s_niah_1,s_niah_3 --depths=0,25,50,75,100 --samples=10"}
        return report.findings(runs).splitlines()

    runs = {n: fake(0.8, [0.5, 0.0, 0.0, 0.0]) for n in report.ORDER[:7]}
    runs["gla"] = fake(0.9, [0.2, 0.1, 0.0, 0.0])
    runs["gated_deltanet"] = fake(0.95, [1.0, 0.9, 0.5, 0.1])
    lines = judged(runs)
    assert lines[0].startswith("- Gated beats ungated") and ": holds." in lines[0]  # intervals of +-2 points apart
    assert "Gated DeltaNet keeps retrieval best" in lines[1] and ": holds." in lines[1]
    assert all(": holds." in line for line in lines[2:4])  # LA and RetNet: 0% past 512, 50% at 512
    assert lines[2].endswith("(the study at 10B tokens: 512: 0%, 1024: 0%, 2048: 0%, 4096: 0%)")
    assert lines[3].endswith("(the study at 10B tokens: 2048: 0%, 4096: 0%)")  # RetNet's 512 and 1k: not reported
    assert "; the study at 10B tokens: Gated DeltaNet 77%, mLSTM 52%, DeltaNet 49%, KDA 11%, GLA 3%, " \
           "Linear Attention 0%" in lines[1]
    runs["linear_attention"] = fake(0.8, [0.04, 0.0, 0.0, 0.0])
    assert ": holds, and it finds at most 5% at 512 too." in judged(runs)[2]
    cut = fake(0.8, [0.5, 0.3, 0.0, 0.0])  # a run whose NIAH after SFT did not finish: judged after stage 3
    runs["retnet"] = {"after_stage3": cut["after_stage3"], "after_sft": {**cut["after_sft"], "niah": {}}}
    lines = judged(runs)
    assert "(passkey at most 5% at each longer length, after stage 3; after SFT not measured): does not hold. " \
           "512: 50% [" in lines[3] and "], 1024: 30% [" in lines[3]
    # the retrieval ranking takes it after stage 3 too, and says so in the verdict and beside its number
    assert ": holds, with RetNet judged after stage 3 (after SFT not measured). " in lines[1]
    assert "Gated DeltaNet 62.5% [" in lines[1] and "], RetNet 20% [" in lines[1] and "] (after stage 3), " in lines[1]
    runs["retnet"]["after_stage3"] = fake(0.8, [1.0, 1.0, 1.0, 1.0])["after_stage3"]  # its stand-in can win
    assert ": does not hold, with RetNet judged after stage 3 (after SFT not measured). RetNet 100% [98.1, 100.0] (after stage 3)" \
        in judged(runs)[1]
    runs["retnet"] = fake(0.8, [0.5, 0.0, 0.0, 0.0])
    runs["gla"] = fake(0.81, [0.2, 0.1, 0.0, 0.0])  # [79, 83] against Linear Attention's [78, 82]
    line = judged(runs)[0]  # one pair apart, the other overlapping: each marked
    assert ": not settled at this budget (the 95% intervals of 1 of 2 pairs overlap)." in line
    assert "GLA 81.0% [79.0, 83.0] vs Linear Attention 80.0% [78.0, 82.0] (intervals overlap)" in line
    assert "Gated DeltaNet 95.0% [93.0, 97.0] vs DeltaNet 80.0% [78.0, 82.0] (holds)" in line
    runs["deltanet"] = fake(1.0, [1.0, 0.9, 0.5, 0.1])  # ungated DeltaNet above its gated twin, tied on the passkey
    lines = judged(runs)
    assert ": does not hold." in lines[0] and ": not settled (Gated DeltaNet 62.5% [55.6, 68.9] against DeltaNet 62.5% " \
        "[55.6, 68.9]: the 95% intervals overlap)." in lines[1]
    runs["deltanet"] = fake(1.0, [1.0, 1.0, 1.0, 1.0])
    runs["retnet"] = fake(0.8, [0.5, 0.3, 0.0, 0.0])
    lines = judged(runs)
    assert ": does not hold." in lines[1] and ": does not hold." in lines[3]
    del runs["kda"]
    assert "not measured (6 of the seven mixers measured). DeltaNet 100% [98.1, 100.0], Gated DeltaNet 62.5% [" \
        in judged(runs)[1]
    del runs["gla"]  # one pair of two left: judged alone, and said so
    assert ": does not hold for the 1 of 2 pairs measured." in judged(runs)[0]
    del runs["deltanet"]
    assert ": not measured." in judged(runs)[0]


def test_retrieval_is_judged_on_wilson_intervals_over_every_prompt():
    runs = {n: fake(0.8, [0.2, 0.1, 0.2, 0.0]) for n in report.ORDER[:7]}  # 12.5%: 25 needles of 200
    runs["gated_deltanet"] = fake(0.95, [1.0, 0.9, 0.5, 0.1])  # 62.5%: 125 of 200
    for r in runs.values():
        r["settings"] = {"niah": "--tasks=s_niah_1 --depths=0,25,50,75,100 --samples=10"}  # 50 prompts a length
    lines = report.findings(runs).splitlines()
    assert ": holds. Gated DeltaNet 62.5% [55.6, 68.9], " in lines[1] and ", KDA 12.5% [8.6, 17.8]" in lines[1]
    assert "512: 20% [11.2, 33.0], 1024: 10% [4.3, 21.4]" in lines[2]  # Linear Attention's, by length
    runs["kda"] = {**fake(0.8, [0.9, 0.8, 0.4, 0.1]), "settings": runs["kda"]["settings"]}  # 55%: 110 of 200
    assert ": not settled (Gated DeltaNet 62.5% [55.6, 68.9] against KDA 55% [48.1, 61.7]: the 95% intervals " \
           "overlap)." in report.findings(runs).splitlines()[1]
    runs["kda"] = {**fake(0.8, [1.0, 1.0, 0.9, 0.9]), "settings": runs["kda"]["settings"]}  # 95%: above
    assert ": does not hold. KDA 95% [" in report.findings(runs).splitlines()[1]


def test_a_gap_within_the_run_to_run_difference_is_not_a_finding():
    runs = {n: fake(0.8, [0.5, 0.0, 0.0, 0.0]) for n in report.ORDER[:7]}
    runs["gla"] = fake(0.9, [0.2, 0.1, 0.0, 0.0])
    runs["gated_deltanet"] = fake(0.95, [1.0, 0.9, 0.5, 0.1])  # passkey mean 62.5%, KDA's 12.5%
    for n, r in runs.items():
        r.update(command=f"reproduce.py --mixer={n}", date="2026-12-05")
    earlier = json.loads(json.dumps(runs))
    earlier["kda"]["after_stage3"] = fake(0.68, [0.5, 0.0, 0.0, 0.0])["after_stage3"]  # 12 points apart
    earlier["mlstm"]["after_sft"] = fake(0.8, [0.3, 0.0, 0.0, 0.0])["after_sft"]  # mean passkey 5 points apart
    for r in earlier.values():
        r["date"] = "2026-12-03"
    pairs = report.replicates(runs, earlier)
    assert list(pairs) == list(runs)
    assert report.noise(pairs) == {"recovery": pytest.approx(0.12), "passkey": pytest.approx(0.05), "students": 7}
    table = report.replicate_table(pairs)
    assert "| KDA | 2026-12-03, 2026-12-05 | 80.0 [78.0, 82.0] | 68.0 [66.0, 70.0] | +12.0 | 12.5 | 12.5 | +0.0 |" in table
    assert "| mLSTM | 2026-12-03, 2026-12-05 | 80.0 [78.0, 82.0] | 80.0 [78.0, 82.0] | +0.0 | 12.5 | 7.5 | +5.0 |" in table
    # GLA 10 and Gated DeltaNet 15 points above their twins, intervals apart: one gap within 12 points
    lines = report.findings(runs, report.noise(pairs)).splitlines()
    assert ": not settled at this budget (the gaps of 1 of 2 pairs lie within the run-to-run difference)." in lines[0]
    assert "GLA 90.0% [88.0, 92.0] vs Linear Attention 80.0% [78.0, 82.0] (within the run-to-run difference)" in lines[0]
    assert lines[0].endswith("; run-to-run difference 12.0 points (the largest of 7 students run twice)")
    assert ": holds. " in lines[1]  # a lead of 50 points over 5
    assert ": holds." in report.findings(runs).splitlines()[0]  # one run each: intervals alone
    assert report.findings(runs).splitlines()[0].endswith("; no student run twice, so no run-to-run difference")
    runs["kda"]["after_sft"] = fake(0.8, [1.0, 0.8, 0.5, 0.1])["after_sft"]  # 2.5 points behind: within 5
    lines = report.findings(runs, report.noise(report.replicates(runs, earlier))).splitlines()
    assert ": not settled (Gated DeltaNet 62.5% against 60%, a gap within the run-to-run difference). " in lines[1]
    earlier["kda"]["command"] += " --other"  # another command: not a replicate
    assert "kda" not in report.replicates(runs, earlier)
    # with settings, the recipe decides: maturity points and sft_kd add work beside the same stages
    settings = {"mixer": "kda", "tokens": 100_000_000, "steps": {"1": 81, "2": 163, "3": 2808, "sft": 305}}
    earlier["kda"]["settings"] = dict(settings)
    runs["kda"]["settings"] = {**settings, "maturity": {"12484608": 137}, "sft_kd": True,
                               "steps": {**settings["steps"], "sft_kd": 305}}
    assert "kda" in report.replicates(runs, earlier)
    niah = "--tasks=s_niah_1,s_niah_3 --lengths=512,1024,2048,4096{} --depths=0,25,50,75,100 --samples=10"
    earlier["kda"]["settings"]["niah"] = niah.format("")
    runs["kda"]["settings"]["niah"] = niah.format(",8192")  # --long_niah: the same lengths and one more
    assert "kda" in report.replicates(runs, earlier)
    runs["kda"]["settings"]["niah"] = niah.format("").replace("--samples=10", "--samples=20")
    assert "kda" not in report.replicates(runs, earlier)  # the study's lengths measured otherwise
    runs["kda"]["settings"]["niah"] = niah.format("")
    runs["kda"]["settings"]["tokens"] = 50_000_000  # another budget: not a replicate
    assert "kda" not in report.replicates(runs, earlier)


def test_a_student_measured_to_8k_is_compared_at_the_studys_lengths():
    runs = {n: fake(0.8, [0.5, 0.0, 0.0, 0.0]) for n in report.ORDER[:7]}
    runs["gated_deltanet"] = fake(0.95, [1.0, 0.9, 0.5, 0.1])  # mean 62.5% over 512 to 4k
    for n, r in runs.items():
        r.update(command=f"reproduce.py --mixer={n}", date="2026-12-05")
    earlier = json.loads(json.dumps(runs))
    before = report.findings(runs, report.noise(report.replicates(runs, earlier)))
    for m in (runs["gated_deltanet"]["after_stage3"], runs["gated_deltanet"]["after_sft"]):
        m["niah"] = {"s_niah_1": {**m["niah"]["s_niah_1"], "8192": 0.0}}  # a baseline run with --long_niah
    runs["gated_deltanet"]["after_sft_kd"] = json.loads(json.dumps(runs["gated_deltanet"]["after_sft"]))
    runs["gated_deltanet"]["after_sft_kd"]["niah"]["s_niah_1"]["8192"] = 1.0  # beyond the study's lengths: no move
    pairs = report.replicates(runs, earlier)
    assert report.noise(pairs)["passkey"] == 0  # 62.5% in both runs, not 50% against 62.5%
    assert report.findings(runs, report.noise(pairs)).splitlines()[:5] == before.splitlines()[:5]
    assert "Gated DeltaNet 62.5% [" in before.splitlines()[1]
    assert "mean passkey 62.5% vs 62.5% (level)" in report.findings(runs).splitlines()[-1]
    assert "| Gated DeltaNet | 2026-12-05, 2026-12-05 | 95.0 [93.0, 97.0] | 95.0 [93.0, 97.0] | +0.0 | 62.5 | 62.5 | " \
        "+0.0 |" in report.replicate_table(pairs)


def test_the_report_skips_files_that_are_not_runs(tiny, tmp_path, capsys):
    d, _, _ = tiny
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "gla.json").write_text((d / "results" / "gla.json").read_text())
    (tmp_path / "r" / "broken.json").write_text("{not json")
    (tmp_path / "r" / "other.json").write_text('{"name": "x", "after_stage3": {}}')
    report.main([f"--results={tmp_path / 'r'}", f"--assets={tmp_path}"])
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("report.py: skipping") for line in err)
    assert "| GLA |" in (tmp_path / "r" / "report.md").read_text()


def measured(lam, width=0.01, recovery=0.95, kl=0.4, passkey=(0.5, 0.3, 0.1, 0.0)):
    """One evaluation and its NIAH as reproduce.py writes them, with the numbers the report reads:
    LAMBADA accuracy lam +- width, average recovery +- 2 points, KL, the passkey from 512 up."""
    return {"eval": {"model": {"lm": {"ppl": 8.0, "kl": kl}, "lambada": {"acc": {"score": lam, "ci": [lam - width, lam + width]}}},
                     "teacher": {}, "summary": {"recovery": {"lambada": [lam / 0.25, lam / 0.25 - 0.1, lam / 0.25 + 0.1],
                                                             "avg": [recovery, recovery - 0.02, recovery + 0.02]}}},
            "niah": {"s_niah_1": {str(L): a for L, a in zip((512, 1024, 2048, 4096), passkey)}}}


def grown(name, early, end, width=0.01, kl=(0.5, 0.4), at=25_000_000):
    """A whole student run at 100M tokens with maturity points at 12.5M, `at` (about 25M) and 50M:
    LAMBADA accuracy early at `at`, end after stage 3, the passkey (512 / 1k / 2k) climbing."""
    run = {"name": name, "machine": "m", "date": "2026-12-04", "commit": "c0ffee", "command": "python scripts/reproduce.py",
           "settings": {"mixer": name, "tokens": 100_000_000,
                        "stage_tokens": {"1": 2_700_000, "2": 5_300_000, "3": 92_000_000, "sft": 10_000_000}},
           "after_stage3": measured(end, width, kl=kl[1]), "after_sft": measured(end, width)}
    points = ((12_500_000, early - 0.01, kl[0] + 0.1, 0.1), (at, early, kl[0], 0.2), (50_000_000, (early + end) / 2, kl[0], 0.3))
    run["maturity"] = {str(t): {"tokens": t, **measured(a, width, kl=k, passkey=(p, p, p))} for t, a, k, p in points}
    return run


def test_rank_correlation_by_hand():
    assert report.ranks([3, 1, 2, 2]) == [4, 1, 2.5, 2.5]  # ties share the mean of their ranks
    assert report.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert report.spearman([1, 2, 3, 4], [40, 30, 20, 10]) == pytest.approx(-1.0)
    # no ties: 1 - 6 * sum(d^2) / (n (n^2 - 1)) = 1 - 6 * 4 / 120
    assert report.spearman([1, 2, 3, 4, 5], [2, 1, 4, 3, 5]) == pytest.approx(0.8)
    # ties: ranks (1, 2.5, 2.5, 4) against (1, 2, 3, 4), their Pearson correlation 4.5 / sqrt(4.5 * 5)
    assert report.spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(4.5 / (4.5 * 5) ** 0.5)
    assert report.spearman([1, 1, 1], [1, 2, 3]) != report.spearman([1, 1, 1], [1, 2, 3])  # nan: no order
    sure = [[a, a - 0.001, a + 0.001] for a in (0.1, 0.2, 0.3, 0.4, 0.5)]
    assert report.rho_interval(sure, sure) == (1.0, 1.0)  # intervals far apart: the order never moves
    assert report.rho_interval(sure, sure[::-1]) == (-1.0, -1.0)
    vague = [[a, a - 0.5, a + 0.5] for a in (0.1, 0.2, 0.3, 0.4, 0.5)]
    lo, hi = report.rho_interval(vague, vague)
    assert lo < 0 < report.RHO_HOLDS < hi and report.rho_interval(vague, vague) == (lo, hi)  # seeded: the same twice


def line(runs, start):
    """The finding line that starts with start."""
    return next(f for f in report.findings(runs).splitlines() if f.startswith(start))


def test_gaps_established_early_are_judged_from_the_ranks():
    gaps = "- Gaps are established early and persist"
    accs = dict(zip(report.ORDER[:7], (0.10, 0.15, 0.20, 0.25, 0.30, 0.35, 0.40)))
    runs = {n: grown(n, a, a + 0.05, width=0.005) for n, a in accs.items()}
    runs["kda"] = grown("kda", 0.40, 0.45, width=0.005, at=25_001_984)  # a point the stage's steps rounded
    runs["hybrid"] = grown("hybrid", 0.9, 0.01)  # not one of the seven: not ranked
    got = line(runs, gaps)
    assert ": holds. rho 1.00 [1.00, 1.00] over 7 mixers. At 25M: KDA 40.0%, Gated DeltaNet 35.0%, " in got
    assert "; at the end (100M): KDA 45.0%, Gated DeltaNet 40.0%, " in got and "Linear Attention 15.0%; on KL" in got
    assert got.endswith("on KL to the teacher (lower is better, no interval): rho nan")  # every KL the same
    for n, a in accs.items():  # KL falling with accuracy at both points: the same order
        runs[n] = grown(n, a, a + 0.05, width=0.005, kl=(1 - a, 0.9 - a))
    assert line(runs, gaps).endswith("rho 1.00")
    late = dict(zip(accs, sorted(accs.values(), reverse=True)))  # the end's order reversed
    runs.update({n: grown(n, a, late[n], width=0.005) for n, a in accs.items()})
    assert ": does not hold. rho -1.00 [-1.00, -1.00] over 7 mixers." in line(runs, gaps)
    runs.update({n: grown(n, a, a + 0.05, width=0.2) for n, a in accs.items()})  # intervals wider than the gaps
    got = line(runs, gaps)
    lo, hi = (float(x) for x in got.split("rho 1.00 [")[1].split("]")[0].split(", "))
    assert ": not settled. rho 1.00 [" in got and lo < report.RHO_HOLDS < hi
    part = {n: grown(n, a, a + 0.05, width=0.005) for n, a in accs.items()}
    for n in report.ORDER[4:7]:  # four of the seven with maturity points: judged, and said to be a part
        del part[n]["maturity"]
    assert ": holds. rho 1.00 [1.00, 1.00] over 4 of the seven mixers. At 25M: mLSTM 25.0%, GLA 20.0%, RetNet 15.0%, Linear Attention 10.0%; " in line(part, gaps)
    for n in report.ORDER[3:7]:  # three mixers left with maturity points: too few to judge
        del runs[n]["maturity"]
    assert ": not settled (only 3 of the seven mixers measured at both points). rho 1.00 [" in line(runs, gaps)
    for n in runs:
        runs[n].pop("maturity", None)
    assert line(runs, gaps).endswith(": not measured (no run has maturity points).")


def kd(name, sft_recovery, kd_recovery, sft_passkey, kd_passkey):
    """A run with SFT and instruction-aware distillation: average recovery +- 2 points, the passkey."""
    run = grown(name, 0.2, 0.3)
    run["after_sft"] = measured(0.3, recovery=sft_recovery, kl=0.6, passkey=sft_passkey)
    run["after_sft_kd"] = measured(0.3, recovery=kd_recovery, kl=0.5, passkey=kd_passkey)
    return run


def test_instruction_aware_distillation_is_judged_from_the_intervals():
    claim = "- Instruction-aware distillation gives no consistent advantage over SFT"
    flat = (0.5, 0.3, 0.1, 0.0)
    runs = {"gla": grown("gla", 0.2, 0.3)}
    assert line(runs, claim).endswith(": not measured (no run has instruction-aware distillation).")
    runs = {"gla": kd("gla", 0.90, 0.95, flat, flat), "gated_deltanet": kd("gated_deltanet", 0.90, 0.95, flat, flat)}
    got = line(runs, claim)  # its interval [93, 97] wholly above SFT's [88, 92] in both runs
    assert ": does not hold for the 2 runs measured. GLA: recovery 90.0 [88.0, 92.0] after SFT vs 95.0 [93.0, 97.0] " \
           "(above), mean passkey 22.5% vs 22.5% (level); Gated DeltaNet: " in got
    runs["gla"] = kd("gla", 0.90, 0.91, flat, flat)  # overlapping, the passkey level
    assert ": not settled (it is ahead in 1 of 2 runs) for the 2 runs measured." in line(runs, claim)
    runs["gated_deltanet"] = kd("gated_deltanet", 0.90, 0.91, flat, flat)
    assert ": not settled (it is ahead in no run, but no run's passkey falls by more than 10 points)" in line(runs, claim)
    runs["gated_deltanet"] = kd("gated_deltanet", 0.90, 0.91, (1.0, 0.8, 0.4, 0.2), (0.9, 0.5, 0.2, 0.0))
    got = line(runs, claim)  # a fall of 20 points in one run
    assert ": holds for the 2 runs measured." in got and "mean passkey 60% vs 40% (down)" in got
    runs["gla"] = kd("gla", 0.90, 0.95, flat, (0.2, 0.0, 0.0, 0.0))  # above on recovery, down on the passkey: not ahead
    assert ": holds for the 2 runs measured." in line(runs, claim)
    runs["gla"] = kd("gla", 0.90, 0.91, flat, (0.9, 0.7, 0.5, 0.3))  # up 40 points on the passkey: ahead
    assert ": not settled (it is ahead in 1 of 2 runs)" in line(runs, claim)


def test_the_report_draws_maturity_and_sets_instruction_aware_distillation_beside_sft(tmp_path, monkeypatch, capsys):
    r = tmp_path / "r"
    r.mkdir()
    for i, n in enumerate(report.ORDER[:7]):
        (r / f"{n}.json").write_text(json.dumps(grown(n, 0.1 + 0.05 * i, 0.15 + 0.05 * i)))
    (r / "gla.json").write_text(json.dumps(kd("gla", 0.90, 0.91, (0.5, 0.3, 0.1, 0.0), (0.4, 0.2, 0.1, 0.0))))
    broken = grown("swa", 0.1, 0.2)
    del broken["maturity"]["12500000"]["tokens"]
    (r / "swa.json").write_text(json.dumps(broken))
    panels = []
    real = report.save
    monkeypatch.setattr(report, "save", lambda fig, axes, *a: panels.append(
        [{ln.get_label(): ln.get_xydata().tolist() for ln in ax.get_lines()} for ax in axes]) or real(fig, axes, *a))
    report.main([f"--results={r}", f"--assets={tmp_path / 'assets'}"])
    assert "report.py: skipping" in capsys.readouterr().err and "swa.json" not in str(panels)
    assert os.path.getsize(tmp_path / "assets" / "study_maturity.png") > 10_000
    recovery, passkey = panels[-1]  # the maturity figure, drawn last: every point, then the end after stage 3
    tokens = [12_500_000, 25_000_000, 50_000_000, 100_000_000]
    assert [x for x, _ in recovery["KDA"]] == tokens and [x for x, _ in passkey["KDA"]] == tokens
    assert [y for _, y in recovery["KDA"]] == pytest.approx([156, 160, 170, 180])  # LAMBADA's recovery, in %
    assert [y for _, y in passkey["KDA"]] == pytest.approx([10, 20, 30, 30])  # at the end, (50 + 30 + 10) / 3
    assert len(recovery) == 7
    text = (r / "report.md").read_text()
    assert "![maturity](../assets/study_maturity.png)" in text
    assert "| GLA | SFT | 90.0 [88.0, 92.0] | 0.600 | 50 | 30 | 10 | 0 |" in text
    assert "| GLA | instruction-aware distillation | 91.0 [89.0, 93.0] | 0.500 | 40 | 20 | 10 | 0 |" in text
    assert "- Gaps are established early and persist" in text and ": holds. rho 1.00 [" in text
    assert "(it is ahead in no run, but no run's passkey falls by more than 10 points)" in text  # down 5: not counted
    for path in r.glob("*.json"):  # maturity points of other tasks and lengths: nothing to draw, and said so
        run = json.loads(path.read_text())
        for m in run["maturity"].values():
            del m["eval"]["model"]["lambada"], m["eval"]["summary"]["recovery"]["lambada"]
            m["niah"] = {"s_niah_1": {"128": 1.0}}
        run["after_stage3"]["niah"] = {}
        path.write_text(json.dumps(run))
    report.main([f"--results={r}", f"--assets={tmp_path / 'bare'}"])
    assert not os.path.exists(tmp_path / "bare" / "study_maturity.png") and os.path.exists(tmp_path / "bare" / "study_loss.png")
    assert "No maturity point measured LAMBADA or the passkey at 512 / 1k / 2k: no figure." in (r / "report.md").read_text()
    for path in r.glob("*.json"):  # without maturity points or instruction-aware distillation: no figure, and said so
        run = json.loads(path.read_text())
        run.pop("maturity", None), run.pop("after_sft_kd", None)
        path.write_text(json.dumps(run))
    report.main([f"--results={r}", f"--assets={tmp_path / 'none'}"])
    text = (r / "report.md").read_text()
    assert not os.path.exists(tmp_path / "none" / "study_maturity.png") and os.path.exists(tmp_path / "none" / "study_loss.png")
    assert "No run has maturity points (evaluations inside stage 3): no figure." in text
    assert "No run has instruction-aware distillation (after_sft_kd)." in text


def test_maturity_points_outside_stage_3_stop_in_one_line_before_any_step(tiny_inputs, tmp_path):
    d, args = tiny_inputs  # 4k tokens: stages 1 and 2 take whole steps of 64 tokens before stage 3
    fresh = [a for a in args if not a.startswith(("--work", "--results", "--maturity="))]
    said = refused(fresh + ["--maturity=0.01,0.5", f"--work={tmp_path}", f"--results={tmp_path}"])
    assert said.startswith("reproduce.py: --maturity: 0.01 of 4,000 tokens is not inside stage 3 (its tokens "), said
    assert said.endswith("): give fractions inside it, or --maturity= for none"), said
    assert not os.listdir(tmp_path)  # refused before any step
