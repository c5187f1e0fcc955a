"""
The study's comparison from the runs of scripts/reproduce.py: tables in the study's layout,
plots, and the study's findings checked one by one against the numbers.

    python scripts/report.py                         # results/study/*.json -> results/study/report.md, assets/study_*.png
    python scripts/report.py --results=/tmp/r --assets=/tmp/r
    python scripts/report.py --budgets=results/study_1B      # and a table of how the ranking moves with tokens

Tables (one after stage 3, one after SFT): per run, perplexity and KL to the teacher on held-out
text, recovery (student score / teacher score) on each of the study's tasks and on their
average with its 95% interval, and needle-in-a-haystack accuracy by length (the passkey S-NIAH-1
and the UUID S-NIAH-3). The teacher's row gives its own scores. Plots: average recovery by run,
NIAH accuracy against length (a line per run), and every stage's loss curves. The findings are
those of the study's abstract (gated beats ungated; the delta rule with gating keeps retrieval,
Gated DeltaNet best; Linear Attention and RetNet lose it past 512 tokens), each printed with
the numbers it rests on and "holds", "does not hold" or "not measured"; a run whose NIAH after
SFT did not finish is judged on its NIAH after stage 3, and the verdict says so. With --budgets (folders
of runs at other budgets), one more table gives each run's average recovery and mean passkey
accuracy after SFT, a column pair a budget.
"""

import argparse
import glob
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ORDER = ("linear_attention", "retnet", "gla", "mlstm", "deltanet", "gated_deltanet", "kda", "hybrid", "swa")
NAMES = {"linear_attention": "Linear Attention", "retnet": "RetNet", "gla": "GLA", "mlstm": "mLSTM",
         "deltanet": "DeltaNet", "gated_deltanet": "Gated DeltaNet", "kda": "KDA", "swa": "SWA"}
TASKS = {"lambada": "LAMBADA", "arc_easy": "ARC-E", "arc_challenge": "ARC-C", "piqa": "PIQA",
         "hellaswag": "HellaSwag", "winogrande": "WinoGrande"}
NIAH = {"s_niah_1": "passkey", "s_niah_3": "UUID"}
AFTER = {"after_stage3": "after stage 3", "after_sft": "after SFT"}
GATED = {"linear_attention": "gla", "deltanet": "gated_deltanet"}  # each ungated mixer and its gated twin
COLLAPSE = 0.05  # "collapses": passkey accuracy at most this at every length past 512
# The study's passkey accuracy (%) by length, its 10B-token checkpoints (arXiv 2504.14366, its NIAH
# table; mLSTM is its xLSTM row; a length it does not report is left out), printed beside ours.
STUDY_PASSKEY = {n: dict(zip((512, 1024, 2048, 4096), a)) for n, a in {
    "gated_deltanet": (99.4, 97.8, 81.8, 29.8), "mlstm": (95.8, 78.0, 25.2, 8.4), "deltanet": (98.8, 96.2, 0.0, 0.0),
    "kda": (33.4, 7.4, 2.0, 0.8), "gla": (10.6, 1.0, 0.0, 0.0), "linear_attention": (0.0, 0.0, 0.0, 0.0)}.items()}
STUDY_PASSKEY["retnet"] = {2048: 0.0, 4096: 0.0}


def load(results):
    """{name: run} for every <results>/*.json that reproduce.py wrote, in the study's order."""
    runs = {}
    for path in sorted(glob.glob(os.path.join(results, "*.json"))):
        try:
            run = json.load(open(path))
            for m in measures(run).values():  # what the tables read
                m["eval"]["model"]["lm"]["ppl"], m["niah"]
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            print(f"report.py: skipping {path}: not a run of reproduce.py ({type(e).__name__}: {e})", file=sys.stderr)
            continue
        if "name" in run and ("after_stage3" in run or "teacher" in run):
            runs[run["name"]] = run
    return {n: runs[n] for n in sorted(runs, key=place)}


def place(name):
    """Where a run stands in the tables: the teacher, the study's order, then the rest by name."""
    order = ("teacher",) + ORDER
    return (order.index(name) if name in order else len(order), name)


def distilled(run):
    """The tokens of a student's stages 1 to 3."""
    return sum(run["settings"]["stage_tokens"][k] for k in ("1", "2", "3"))


def mean_accuracy(by_length):
    """NIAH accuracy averaged over the lengths measured."""
    return sum(by_length.values()) / len(by_length)


def by_length(acc):
    """A NIAH result's {"512": accuracy, ...} as (length, accuracy) pairs, shortest first."""
    return sorted((int(L), a) for L, a in acc.items())


def label(name, run):
    s = run.get("settings", {})
    if s.get("softmax_layers"):
        return f"{NAMES.get(s['mixer'], s['mixer'])} + softmax layers {s['softmax_layers']}"
    if s.get("mixer") == "swa" and s.get("window"):
        return f"SWA, window {s['window']}"
    return NAMES.get(name, name)


def count(n):
    """4000 -> '4.0k', 100_000_000 -> '100M', 2.76e9 -> '2.76B'."""
    for div, unit in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= div:
            return f"{n / div:.3g}{unit}"
    return str(n)


def lengths(runs):
    return sorted({int(n) for r in runs.values() for m in measures(r).values() for t in m["niah"].values() for n in t})


def measures(run):
    """{after: measured} of a run (the teacher's one measurement counts for both)."""
    if "teacher" in run:
        return {a: run["teacher"] for a in AFTER}
    return {a: run[a] for a in AFTER if a in run}


def pct(v):
    """A score or a recovery [value, low, high] in percent; '-' where the task was not run, or
    where a recovery has no value (the teacher scored 0 on it)."""
    return "-" if v is None or v[0] != v[0] else f"{100 * v[0]:.1f}"


def table(runs, after):
    """The markdown table of one checkpoint (after stage 3 or after SFT)."""
    Ls = lengths(runs)
    head = (["run", "tokens", "ppl", "KL"] + list(TASKS.values()) + ["Avg recovery [95%]"]
            + [f"{NIAH[t]} {L}" for t in NIAH for L in Ls])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, run in runs.items():
        m = measures(run).get(after)
        if m is None:
            continue
        ev = m["eval"]
        niah = [m["niah"].get(t, {}).get(str(L)) for t in NIAH for L in Ls]
        niah = ["-" if a is None else f"{100 * a:.0f}" for a in niah]
        if name == "teacher":
            row = ev["summary"]["rows"][next(iter(ev["summary"]["rows"]))]
            cells = ["teacher", "-", f"{ev['model']['lm']['ppl']:.2f}", "0"] + [
                pct(row.get(t)) for t in TASKS] + [f"({pct(row.get('avg'))})"]
        else:
            rec = ev["summary"]["recovery"]
            s = run["settings"]
            tokens = distilled(run) + (s["stage_tokens"]["sft"] if after == "after_sft" else 0)
            cells = [label(name, run), count(tokens), f"{ev['model']['lm']['ppl']:.2f}",
                     f"{ev['model']['lm']['kl']:.3f}"] + [pct(rec.get(t)) for t in TASKS] + [
                     "-" if "avg" not in rec else f"{pct(rec['avg'])} [{100 * rec['avg'][1]:.1f}, {100 * rec['avg'][2]:.1f}]"]
        lines.append("| " + " | ".join(cells + niah) + " |")
    return "\n".join(lines)


def findings(runs):
    """The study's findings, each with its numbers and a verdict."""
    out = []

    def rec(name):
        run = runs.get(name)
        return run["after_stage3"]["eval"]["summary"]["recovery"].get("avg") if run and "after_stage3" in run else None

    pairs = [(u, g, rec(u), rec(g)) for u, g in GATED.items()]
    known = [p for p in pairs if p[2] and p[3]]

    def judge(a, b):  # a: the ungated twin's [mean, low, high], b: the gated one's
        return "holds" if b[1] > a[2] else "does not hold" if b[2] < a[1] else "intervals overlap"
    judged = [judge(a, b) for _, _, a, b in known]
    text = "; ".join(f"{NAMES[g]} {100 * b[0]:.1f}% [{100 * b[1]:.1f}, {100 * b[2]:.1f}] vs {NAMES[u]} "
                     f"{100 * a[0]:.1f}% [{100 * a[1]:.1f}, {100 * a[2]:.1f}]"
                     + (f" ({v})" if len(set(judged)) > 1 else "") for (u, g, a, b), v in zip(known, judged))
    if not known:
        verdict = "not measured"
    elif all(v == "holds" for v in judged):  # every gated interval above its twin's
        verdict = "holds"
    elif "does not hold" in judged:  # a gated interval below its twin's
        verdict = "does not hold"
    else:
        n = judged.count("intervals overlap")
        verdict = ("not settled at this budget (the 95% intervals overlap)" if n == len(known) else
                   f"not settled at this budget (the 95% intervals of {n} of {len(known)} pairs overlap)")
    if known and len(known) < len(pairs):
        verdict += f" for the {len(known)} of {len(pairs)} pairs measured"
    out.append(f"- Gated beats ungated (average recovery after stage 3): {verdict}. {text}".rstrip())

    def passkey(name):
        """(passkey accuracy by length after SFT, False), or (after stage 3, True) for a run whose
        NIAH after SFT did not finish, or (None, False)."""
        run = runs.get(name) or {}
        for after in ("after_sft", "after_stage3"):
            p = run[after]["niah"].get("s_niah_1") if after in run else None
            if p:
                return p, after == "after_stage3"
        return None, False

    got = {n: passkey(n) for n in ORDER[:7]}
    seven = [n for n in ORDER[:7] if got[n][0]]
    cut = [n for n in seven if got[n][1]]  # stand in with their NIAH after stage 3, marked
    mean = {n: mean_accuracy(got[n][0]) for n in seven}
    ranks = ", ".join(f"{NAMES[n]} {100 * mean[n]:.0f}%" + (" (after stage 3)" if n in cut else "")
                      for n in sorted(mean, key=mean.get, reverse=True))
    study = {n: mean_accuracy(a) for n, a in STUDY_PASSKEY.items() if len(a) == 4}  # every length reported
    ranks += "; the study at 10B tokens: " + ", ".join(f"{NAMES[n]} {study[n]:.0f}%" for n in
                                                        sorted(study, key=study.get, reverse=True))
    if len(seven) < 7:
        out.append(f"- Gated DeltaNet keeps retrieval best (mean passkey accuracy over lengths, after SFT): not measured "
                   f"({len(seven)} of the seven mixers measured). {ranks}".rstrip())
    else:
        top = max(mean.values())
        best = [n for n in seven if mean[n] == top]
        verdict = "does not hold" if "gated_deltanet" not in best else "holds" if len(best) == 1 else \
            "tied: " + " and ".join(NAMES[n] for n in best) + " share the best"
        if cut:
            verdict += ", with " + " and ".join(NAMES[n] for n in cut) + " judged after stage 3 (after SFT not measured)"
        out.append(f"- Gated DeltaNet keeps retrieval best (mean passkey accuracy over lengths, after SFT): "
                   f"{verdict}. {ranks}")
    for n in ("linear_attention", "retnet"):
        p, late = passkey(n)
        when = "after stage 3; after SFT not measured" if late else "after SFT"
        if not p:
            out.append(f"- {NAMES[n]} loses retrieval past 512 tokens: not measured.")
            continue
        acc = dict(by_length(p))
        past = {L: a for L, a in acc.items() if L > 512}
        verdict = "not measured" if not past else "holds" if max(past.values()) <= COLLAPSE else "does not hold"
        if verdict == "holds" and acc.get(512, 1) <= COLLAPSE:
            verdict += f", and it finds at most {100 * COLLAPSE:.0f}% at 512 too"
        study = ", ".join(f"{L}: {a:.0f}%" for L, a in STUDY_PASSKEY[n].items())
        out.append(f"- {NAMES[n]} loses retrieval past 512 tokens (passkey at most {100 * COLLAPSE:.0f}% at each "
                   f"longer length, {when}): {verdict}. "
                   + ", ".join(f"{L}: {100 * a:.0f}%" for L, a in acc.items())
                   + f" (the study at 10B tokens: {study})")
    return "\n".join(out)


def save(fig, axes, ylabel, path):
    """A row of panels finished (the y label, one legend of every line's label, right of the last
    panel) and written to path."""
    import matplotlib.pyplot as plt

    axes[0].set_ylabel(ylabel)
    legend = {}  # label -> handle, in the order the panels first show them
    for ax in axes:
        for handle, label_ in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(label_, handle)
    if legend:
        axes[-1].legend(legend.values(), legend.keys(), fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plots(runs, assets):
    """study_recovery.png, study_niah.png, study_loss.png and (when a student the study measured is
    here) study_passkey.png under assets; returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    students = {n: r for n, r in runs.items() if n != "teacher"}
    # one colour a run in every panel, whichever panels it has numbers for; the teacher dashed black
    style = {n: {"color": f"C{i % 10}"} for i, n in enumerate(students)} | {"teacher": {"color": "k", "ls": "--"}}
    paths = []
    fig, ax = plt.subplots(figsize=(10, 4))
    width = 0.4
    for i, (after, name) in enumerate(AFTER.items()):
        xs, ys, errs = [], [], []
        for j, (n, r) in enumerate(students.items()):
            if after in r and "avg" in r[after]["eval"]["summary"]["recovery"]:
                a = r[after]["eval"]["summary"]["recovery"]["avg"]
                xs.append(j + (i - 0.5) * width)
                ys.append(100 * a[0])
                errs.append([[100 * (a[0] - a[1])], [100 * (a[2] - a[0])]])
        if xs:
            ax.bar(xs, ys, width, label=name, yerr=[[e[0][0] for e in errs], [e[1][0] for e in errs]], capsize=3)
    ax.set_xticks(range(len(students)), [label(n, r) for n, r in students.items()], rotation=20, ha="right", fontsize=8)
    ax.axhline(100, color="k", lw=0.8, ls="--")
    ax.set_ylabel("average recovery (%), 95% interval")
    ax.legend(loc="lower left", bbox_to_anchor=(0, 1.01), ncol=2, fontsize=8, frameon=False)  # above the bars
    fig.tight_layout()
    paths.append(os.path.join(assets, "study_recovery.png"))
    fig.savefig(paths[-1], dpi=120)
    plt.close(fig)

    fig, axes = plt.subplots(1, len(AFTER) * len(NIAH), figsize=(16, 3.8), sharey=True)
    for ax, (after, task) in zip(axes, [(a, t) for a in AFTER for t in NIAH]):
        for n, r in runs.items():
            m = measures(r).get(after)
            acc = m and m["niah"].get(task)
            if acc:
                Ls, ys = zip(*by_length(acc))
                ax.plot(Ls, [100 * a for a in ys], marker="o", label=label(n, r), **style[n])
        ax.set_xscale("log", base=2)
        ax.set_title(f"{NIAH[task]}, {AFTER[after]}", fontsize=9)
        ax.set_ylim(-3, 103)
        ax.set_xlabel("prompt length (tokens)")
        ax.grid(True, alpha=0.3)
    paths.append(save(fig, axes, "accuracy (%)", os.path.join(assets, "study_niah.png")))

    stages = ("1", "2", "3", "sft")
    fig, axes = plt.subplots(1, len(stages), figsize=(16, 3.8))
    for ax, s in zip(axes, stages):
        for n, r in students.items():
            h = r.get("history", {}).get(s)
            if h and h["train"]:
                ax.plot(*zip(*h["train"]), lw=0.8, label=label(n, r), **style[n])
        ax.set_yscale("log")
        ax.set_title(f"stage {s}" if s != "sft" else "SFT", fontsize=9)
        ax.set_xlabel("step")
        ax.grid(True, alpha=0.3)
    paths.append(save(fig, axes, "train loss", os.path.join(assets, "study_loss.png")))

    # passkey by length of each student the study measured: ours after stage 3 and after SFT
    # against the study's 10B-token checkpoint
    ours = [n for n in students if n in STUDY_PASSKEY and "after_sft" in students[n]]
    if ours:
        fig, axes = plt.subplots(1, len(ours), figsize=(3.2 * len(ours) + 1, 3.4), sharey=True, squeeze=False)
        for ax, n in zip(axes[0], ours):
            for after, look in (("after_stage3", {"alpha": 0.45}), ("after_sft", {})):
                acc = measures(students[n]).get(after, {}).get("niah", {}).get("s_niah_1")
                if acc:
                    Ls, ys = zip(*by_length(acc))
                    ax.plot(Ls, [100 * a for a in ys], marker="o", color="C0",
                            label=f"here, {AFTER[after]}", **look)
            ax.plot(list(STUDY_PASSKEY[n]), list(STUDY_PASSKEY[n].values()), marker="x", color="k", ls="--", label="the study, 10B tokens")
            ax.set_xscale("log", base=2)
            ax.set_title(f"{NAMES[n]}: distilled on {count(distilled(students[n]))} tokens here", fontsize=9)
            ax.set_ylim(-3, 103)
            ax.set_xlabel("prompt length (tokens)")
            ax.grid(True, alpha=0.3)
        paths.append(save(fig, axes[0], "passkey accuracy (%)", os.path.join(assets, "study_passkey.png")))
    return paths


def budget(runs):
    """The distillation budget of a folder's students, as a column label ('100M')."""
    return "/".join(sorted({count(distilled(r)) for n, r in runs.items() if n != "teacher"}))


def budget_table(folders):
    """Average recovery and mean passkey accuracy after SFT of every run, a column pair a folder
    of runs (one budget each): how the ranking moves with tokens."""
    labels = [budget(runs) for runs in folders]
    names = sorted({n for runs in folders for n in runs} - {"teacher"}, key=place)
    head = ["run"] + [f"{b}: {what}" for b in labels for what in ("recovery", "passkey")]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for n in names:
        cells = [label(n, next(runs[n] for runs in folders if n in runs))]
        for runs in folders:
            m = runs.get(n, {}).get("after_sft")
            rec = m and m["eval"]["summary"]["recovery"].get("avg")
            key = m and m["niah"].get("s_niah_1")
            cells += [pct(rec) if rec else "-", f"{100 * mean_accuracy(key):.0f}" if key else "-"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", default=os.path.join(ROOT, "results", "study"), help="reproduce.py's JSON files")
    ap.add_argument("--out", default=None, help="the report (default <results>/report.md)")
    ap.add_argument("--assets", default=os.path.join(ROOT, "assets"), help="where the plots go")
    ap.add_argument("--budgets", default="", help="folders of runs at other budgets, comma-separated: a table by budget")
    args = ap.parse_args(argv)
    folders = [args.results] + [f for f in args.budgets.split(",") if f]
    loaded = [load(f) for f in folders]
    for f, r in zip(folders, loaded):
        if not [n for n in r if n != "teacher"]:
            sys.exit(f"report.py: no student results in {f} (scripts/reproduce.py writes them)")
    runs = loaded[0]
    os.makedirs(args.assets, exist_ok=True)
    lines = []
    for after, title in AFTER.items():
        lines += [f"### {title[0].upper() + title[1:]}", "", table(runs, after), ""]
    if len(loaded) > 1:
        lines += ["### By budget: average recovery and mean passkey accuracy after SFT (%)", "",
                  budget_table(loaded), ""]
    lines += ["### The study's findings here", "", findings(runs), "", "Runs:", ""]
    for folder in loaded:
        for n, r in folder.items():
            lines.append(f"- {label(n, r)}: {r['machine']}, {r['date']}, commit {r['commit']}: `{r['command']}`"
                         + (f". Incomplete: {r['incomplete']}" if r.get("incomplete") else ""))
    report = "\n".join(lines) + "\n"
    out = args.out or os.path.join(args.results, "report.md")
    with open(out, "w") as f:
        f.write(report)
    print(report)
    for p in plots(runs, args.assets):
        print(f"plot: {p}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
