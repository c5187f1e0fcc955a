"""
Plots a reader would rather look at than read: the loss curves of a training run.

train.py draws one beside every checkpoint (<out_dir>/<mixer>/stage<N>.png). pyplot() is
matplotlib's pyplot as every other figure of the project draws with it: into files, no display.
"""

import os


def pyplot():
    """matplotlib's pyplot, drawing into files alone (the Agg backend: no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot(history, path):
    """The loss curves as a PNG (train and val loss; val KL and top-1 agreement)."""
    try:  # a Figure of its own, not pyplot's: no display, and safe on train.py's writing thread
        from matplotlib.figure import Figure
    except ImportError:
        return
    fig = Figure(figsize=(11, 4))
    a, b = fig.subplots(1, 2)
    if history["train"]:
        a.plot(*zip(*history["train"]), label="train", lw=0.8)
    val = history["val"]
    if val:
        a.plot([v["step"] for v in val], [v["loss"] for v in val], "o-", label="val")
        b.plot([v["step"] for v in val], [v["kl"] for v in val], "o-", color="C2", label="KL(teacher || student)")
        b2 = b.twinx()
        b2.plot([v["step"] for v in val], [v["top1"] for v in val], "s--", color="C3", label="top-1 agreement")
        b2.set_ylabel("top-1 agreement")
        b2.legend(loc="upper right")
    name = os.path.basename(os.path.dirname(os.path.abspath(path))) + ", " + os.path.basename(path)[:-4]
    a.set(xlabel="step", ylabel="stage loss", yscale="log", title=name.replace("stage", "stage "))
    b.set(xlabel="step", ylabel="val KL per token", title="student vs teacher (val)")
    a.legend()
    b.legend(loc="upper left")
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path + ".tmp", format="png", dpi=90)
    os.replace(path + ".tmp", path)


def recipe(out_dir, path):
    """scripts/recipe.sh's comparison as a PNG: each student's recovery per task with its 95%
    interval (evaluate.py's <run>.eval.json), and its NIAH accuracy by length (niah.py's
    <run>.niah/results.json)."""
    import glob
    import json

    plt = pyplot()

    runs = sorted(p[len(out_dir) + 1:-len(".eval.json")] for p in glob.glob(os.path.join(out_dir, "*.eval.json")))
    if not runs:
        return
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4), gridspec_kw={"width_ratios": [3, 2]})
    width = 0.8 / len(runs)
    for i, run in enumerate(runs):
        with open(os.path.join(out_dir, run + ".eval.json")) as f:
            s = json.load(f)["summary"]
        cols = s["avg_of"] + ["avg"]
        rec = [s["recovery"][c] for c in cols]
        x = [j + (i - (len(runs) - 1) / 2) * width for j in range(len(cols))]
        mid = [100 * r[0] for r in rec]
        err = [[100 * (r[0] - r[1]) for r in rec], [100 * (r[2] - r[0]) for r in rec]]
        a.bar(x, mid, width, yerr=err, capsize=2, label=run, color=f"C{i}")
        with open(os.path.join(out_dir, run + ".niah", "results.json")) as f:
            by = {}
            for r in json.load(f)["records"]:
                by.setdefault(r["task"], {}).setdefault(r["length"], []).append(r["correct"])
        for k, (task, per) in enumerate(sorted(by.items())):
            lengths = sorted(per)
            b.plot(lengths, [100 * sum(per[n]) / len(per[n]) for n in lengths], marker="os^"[k % 3],
                   color=f"C{i}", ls=["-", "--", ":"][k % 3], label=f"{run} {task}")
    a.axhline(100, color="k", lw=0.6)
    a.set_xticks(range(len(cols)), [c.replace("_", "-") for c in cols])
    a.set(ylabel="recovery = student / teacher (%)", ylim=(0, 120),
          title="task recovery, 95% paired-bootstrap intervals")
    a.legend(loc="lower right", fontsize=8)
    b.set(xscale="log", xlabel="prompt length (tokens)", ylabel="string match (%)", ylim=(-3, 103),
          title="needle in a haystack")
    b.minorticks_off()
    b.set_xticks(lengths, [str(n) for n in lengths])
    b.legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(path + ".tmp", format="png", dpi=90)
    plt.close(fig)
    os.replace(path + ".tmp", path)
