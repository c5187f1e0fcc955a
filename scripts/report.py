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
SFT did not finish is judged on its NIAH after stage 3, and the verdict says so. A passkey's mean,
and every finding on it, reads the study's lengths alone (to 4k), so that a student measured to 8k
too (--long_niah, the baseline of a long-context run) is compared as the others are. With --budgets (folders
of runs at other budgets), one more table gives each run's average recovery and mean passkey
accuracy after SFT, a column pair a budget.

Two more of the study's findings where the runs measured them. Maturity: a run's "maturity"
points (LAMBADA and the passkey at 512 / 1k / 2k, measured inside stage 3 at so many distillation
tokens) and its end after stage 3 make study_maturity.png, LAMBADA recovery and mean passkey
accuracy against tokens; "gaps are established early and persist" compares the seven mixers'
order by LAMBADA accuracy at 25M tokens with their order at the end (Spearman's rho, with a 95%
interval). Instruction-aware distillation: a run's "after_sft_kd" (SFT with KL to the
instruction-tuned teacher, from the same stage-3 student on the same data and budget) is set
against its SFT in a table, and the study's "no consistent advantage, and in some cases worse
long-context retrieval" judged from the two.

Beyond the study, long-context distillation (reproduce.py --long_context: the last part of stage 3
on longer sequences, the same tokens): each such run beside its baseline (the same student, recipe
and budget without it) in a table of recovery, KL and the passkey and UUID by length with Wilson's
95% intervals, a figure of the passkey against length (study_long.png), and one verdict on the
study's claim that state resolution, not the distillation budget, bounds retrieval: "retrieval
follows the training length", "retrieval is bounded by the state" or "not settled", by the rule
in long_verdict. These runs (and teacher_long, the teacher measured to 8k) stay out of the
study's tables.

Where each run's time went: the "all" row of each run's time table (reproduce.py's "time_groups":
start-up and loading, compiling, training, evaluating, evaluations and checkpoint writes inside
training, the process's own time) as a table, training proper against the fixed costs, and
study_time.png, a bar a run split the same way, with a line at 15 minutes.

Replicates: <results>/earlier holds earlier runs of the same recipes (a run's JSON moves there
when the recipe runs again; maturity points and --sft_kd add work beside a run and change none of
its stages, so a run with them replicates one without). Each student run twice gets a row of the replicate table: average
recovery after stage 3 and mean passkey accuracy (after SFT) in both runs and their difference.
The findings that compare students take the largest such difference as the run-to-run noise: a
gap between two students no larger than it is not a finding ("not settled").
"""

import argparse
import glob
import json
import os
import re
import shlex
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # evaluate.wilson, the intervals of NIAH accuracies
from plots import pyplot  # noqa: E402
from reproduce import LONG_FRAC  # noqa: E402  -- a run's share of stage 3 at the long length, by default
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
STUDY_LONGEST = 4096  # the study's longest NIAH: a passkey's mean and the findings read no longer one, so a
# student measured to 8k too (--long_niah, a long-context run's baseline) is compared as the others are
STUDY_PASSKEY = {n: dict(zip((512, 1024, 2048, 4096), a)) for n, a in {
    "gated_deltanet": (99.4, 97.8, 81.8, 29.8), "mlstm": (95.8, 78.0, 25.2, 8.4), "deltanet": (98.8, 96.2, 0.0, 0.0),
    "kda": (33.4, 7.4, 2.0, 0.8), "gla": (10.6, 1.0, 0.0, 0.0), "linear_attention": (0.0, 0.0, 0.0, 0.0)}.items()}
STUDY_PASSKEY["retnet"] = {2048: 0.0, 4096: 0.0}
SHORT = (512, 1024, 2048)  # the passkey lengths a maturity point measures, and its mean's
EARLY = 25_000_000  # distillation tokens of the early order that "gaps persist" sets against the end's
RHO_HOLDS = 0.5  # "gaps persist": holds when rho's 95% interval lies above this, does not hold below it
FEW = 4  # fewer mixers with both points than this: an order too short to judge
# Long-context distillation (reproduce.py --long_context): a run against its baseline
DELTA = ("deltanet", "gated_deltanet", "kda")  # the delta-rule mixers (KDA: the delta rule, gated per channel)
RECIPE_LENGTHS = (512, 1024)  # the study's recipe trains on these: distillation, then SFT
TRAINED = max(RECIPE_LENGTHS)  # "beyond the training length": a baseline saw nothing longer
# what a baseline and its long-context run must share to be set side by side: the student, the
# recipe and the budget (reproduce.py's settings; the evaluation's may differ)
RECIPE = ("mixer", "softmax_layers", "window", "tokens", "stage_tokens", "tokens_per_step", "sft_tokens_per_step",
          "text", "chat", "extra")
PASSKEY_MOVES = 0.10  # a mean passkey accuracy (4 lengths x 50 prompts) moved by more than this has changed:
# about the 95% noise of the difference of two such means at 50% accuracy, 1.96 * sqrt(2 * 0.25 / 200)


def load(results):
    """{name: run} for every <results>/*.json that reproduce.py wrote, in the study's order."""
    runs = {}
    for path in sorted(glob.glob(os.path.join(results, "*.json"))):
        try:
            run = json.load(open(path))
            for m in measures(run).values():  # what the tables read
                m["eval"]["model"]["lm"]["ppl"], m["niah"]
            for m in list(run.get("maturity", {}).values()) + ([run["after_sft_kd"]] if "after_sft_kd" in run else []):
                m["eval"]["model"]["lm"], m["eval"]["summary"]["recovery"], m["niah"]  # what the figure and findings read
            for p in run.get("maturity", {}).values():
                int(p["tokens"])
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
    if s.get("long_context"):  # its baseline's label, and the setting
        base = name.rsplit("_long", 1)[0] if "_long" in name else s.get("mixer", name)
        return (f"{label(base, {**run, 'settings': {k: v for k, v in s.items() if k != 'long_context'}})}, "
                f"last {100 * s.get('long_frac', LONG_FRAC):g}% of stage 3 at {s['long_context']}")
    if s.get("softmax_layers"):
        return f"{NAMES.get(s['mixer'], s['mixer'])} + softmax layers {s['softmax_layers']}"
    if s.get("mixer") == "swa" and s.get("window"):
        return f"SWA, window {s['window']}"
    if name == "teacher_long":
        return "teacher, NIAH to 8k"
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


def points(share):
    """A share as percentage points, to the tenth where it is not whole: 0.455 -> '45.5', 0.47 -> '47'."""
    return f"{100 * share:.1f}".removesuffix(".0")


def bounds(v):
    """The interval of [value, low, high] in percent: '[92.9, 97.5]'."""
    return f"[{100 * v[1]:.1f}, {100 * v[2]:.1f}]"


def with_interval(v):
    """An accuracy [value, low, high] as '47% [40.2, 53.9]': the value in points, its 95% interval."""
    return f"{points(v[0])}% {bounds(v)}"


def interval(v):
    """[value, low, high] in percent with its interval: '95.2 [92.9, 97.5]'; '-' where missing."""
    return "-" if v is None else f"{pct(v)} {bounds(v)}"


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
                     interval(rec.get("avg"))]
        lines.append("| " + " | ".join(cells + niah) + " |")
    return "\n".join(lines)


def curve(run):
    """A student's points through distillation, {tokens: measured}: its maturity points inside stage
    3, and its end (after stage 3), each at the tokens its steps took."""
    points = {int(p["tokens"]): p for p in run.get("maturity", {}).values()}
    if "after_stage3" in run:
        points[distilled(run)] = run["after_stage3"]
    return dict(sorted(points.items()))


def lambada(m):
    """A measurement's LAMBADA accuracy [score, low, high] (Wilson's 95% interval), or None."""
    acc = m["eval"]["model"].get("lambada", {}).get("acc")
    return [acc["score"], *acc["ci"]] if acc else None


def short_passkey(m):
    """Passkey accuracy averaged over 512, 1k and 2k tokens (the lengths a maturity point measures),
    or None where one of them is missing."""
    acc = m["niah"].get("s_niah_1", {})
    return mean_accuracy({L: acc[str(L)] for L in SHORT}) if all(str(L) in acc for L in SHORT) else None


def ranks(xs):
    """Ranks from 1, smallest first; tied values share the mean of the ranks they span."""
    return [sum(y < x for y in xs) + (sum(y == x for y in xs) + 1) / 2 for x in xs]


def spearman(a, b):
    """Spearman's rank correlation of two paired lists: Pearson's correlation of their ranks (so ties
    are handled); nan where either list is one value throughout."""
    ra, rb = ranks(a), ranks(b)
    ma, mb = sum(ra) / len(ra), sum(rb) / len(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    va, vb = sum((x - ma) ** 2 for x in ra), sum((y - mb) ** 2 for y in rb)
    return cov / (va * vb) ** 0.5 if va and vb else float("nan")


def rho_interval(early, late, n_boot=1000, seed=0):
    """95% interval of Spearman's rho between two lists of scores [value, low, high]: every score
    redrawn from a normal of its own 95% interval (mean the value, sd (high - low) / 3.92), rho
    recomputed, 1,000 times (seed 0), its 2.5 and 97.5 percentiles. The spread is that of measuring
    each student, not of picking them: the seven are the whole comparison (and a bootstrap over
    seven students is mostly ties). The two points share their questions, whose common difficulty
    moves every student alike; drawing them independently if anything widens the interval."""
    import numpy as np

    rng = np.random.default_rng(seed)
    draw = [rng.normal(*np.array([[v, (hi - lo) / 3.92] for v, lo, hi in scores]).T, size=(n_boot, len(scores)))
            for scores in (early, late)]
    lo, hi = np.percentile([spearman(list(x), list(y)) for x, y in zip(*draw)], [2.5, 97.5])
    return float(lo), float(hi)


def early_point(run):
    """A run's maturity point nearest EARLY tokens, within a tenth of it (a stage's steps round the
    tokens), or None."""
    near = [p for p in run.get("maturity", {}).values() if abs(int(p["tokens"]) / EARLY - 1) <= 0.1]
    return min(near, key=lambda p: abs(int(p["tokens"]) - EARLY), default=None)


def kd_table(runs):
    """Each run with instruction-aware distillation against its SFT: average recovery, KL to the
    teacher on held-out text and the passkey by length."""
    pairs = {n: r for n, r in runs.items() if "after_sft_kd" in r and "after_sft" in r}
    Ls = sorted({int(L) for r in pairs.values() for a in ("after_sft", "after_sft_kd")
                 for L in r[a]["niah"].get("s_niah_1", {})})
    head = ["run", "after", "Avg recovery [95%]", "KL"] + [f"passkey {L}" for L in Ls]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for n, r in pairs.items():
        for after, what in (("after_sft", "SFT"), ("after_sft_kd", "instruction-aware distillation")):
            ev, key = r[after]["eval"], r[after]["niah"].get("s_niah_1", {})
            kl = ev["model"]["lm"].get("kl")
            cells = [label(n, r), what, interval(ev["summary"]["recovery"].get("avg")), "-" if kl is None else f"{kl:.3f}"]
            cells += ["-" if str(L) not in key else f"{100 * key[str(L)]:.0f}" for L in Ls]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def gaps(runs):
    """The finding "gaps are established early and persist": the seven mixers' order by LAMBADA
    accuracy at EARLY tokens against their order at the end of stage 3. LAMBADA accuracy is the
    score both points measure with an interval; its recovery divides it by one teacher score, so
    it orders the students the same. KL to the teacher (lower is better) is printed beside it,
    without an interval."""
    claim = (f"- Gaps are established early and persist (the seven mixers ordered by LAMBADA accuracy at "
             f"{count(EARLY)} distillation tokens and at the end of stage 3, Spearman's rho with a 95% interval "
             f"from redrawing each score within its own 95% interval; holds if the interval lies above "
             f"{RHO_HOLDS}, does not hold if below)")
    if not any("maturity" in r for n, r in runs.items() if n != "teacher"):
        return f"{claim}: not measured (no run has maturity points)."
    both = {}
    for n in ORDER[:7]:
        r = runs.get(n, {})
        e = early_point(r)
        if e and "after_stage3" in r and lambada(e) and lambada(r["after_stage3"]):
            both[n] = (e, r["after_stage3"])
    if len(both) < 2:
        return f"{claim}: not settled ({len(both)} of the seven mixers measured at both points)."
    early, late = ([lambada(pts[i]) for pts in both.values()] for i in (0, 1))
    rho, (lo, hi) = spearman([e[0] for e in early], [e[0] for e in late]), rho_interval(early, late)
    if len(both) < FEW:
        verdict = f"not settled (only {len(both)} of the seven mixers measured at both points)"
    else:
        verdict = "holds" if lo > RHO_HOLDS else "does not hold" if hi < RHO_HOLDS else "not settled"
    ends = "/".join(sorted({count(distilled(runs[n])) for n in both}))

    def order(i):  # the mixers best first at point i (0 early, 1 the end), with their accuracy
        acc = {n: lambada(pts[i])[0] for n, pts in both.items()}
        return ", ".join(f"{NAMES[n]} {100 * acc[n]:.1f}%" for n in sorted(acc, key=acc.get, reverse=True))

    kl = [[pts[i]["eval"]["model"]["lm"].get("kl") for pts in both.values()] for i in (0, 1)]
    kl = "" if None in kl[0] + kl[1] else f"; on KL to the teacher (lower is better, no interval): rho {spearman(*kl):.2f}"
    over = f"{len(both)} mixers" if len(both) == 7 else f"{len(both)} of the seven mixers"  # judged on part of the seven: say how many
    return (f"{claim}: {verdict}. rho {rho:.2f} [{lo:.2f}, {hi:.2f}] over {over}. "
            f"At {count(EARLY)}: {order(0)}; at the end ({ends}): {order(1)}{kl}")


def instruction_aware(runs):
    """The finding that instruction-aware distillation (SFT with KL to the instruction-tuned
    teacher) gives no consistent advantage over SFT and in some cases degrades long-context
    retrieval. A run counts as ahead with it when its average recovery interval lies wholly above
    SFT's or its mean passkey accuracy rises by more than PASSKEY_MOVES, and neither falls (an
    interval wholly below, a drop of more than PASSKEY_MOVES). Ahead in every run: does not hold;
    ahead in none, and the passkey down in at least one: holds; otherwise not settled."""
    claim = ("- Instruction-aware distillation gives no consistent advantage over SFT, and in some cases "
             f"degrades long-context retrieval (average recovery's 95% intervals; mean passkey accuracy over "
             f"lengths, a move of more than {100 * PASSKEY_MOVES:.0f} points counted)")
    pairs = [(n, r["after_sft"], r["after_sft_kd"]) for n, r in runs.items() if "after_sft_kd" in r and "after_sft" in r
             and all("avg" in r[a]["eval"]["summary"]["recovery"] for a in ("after_sft", "after_sft_kd"))]
    if not pairs:
        return f"{claim}: not measured (no run has instruction-aware distillation)."
    ahead, worse, text = [], [], []
    for n, sft, kd in pairs:
        a, b = (m["eval"]["summary"]["recovery"]["avg"] for m in (sft, kd))
        rec = "above" if b[1] > a[2] else "below" if b[2] < a[1] else "overlap"
        keys = [study_lengths(m["niah"].get("s_niah_1", {})) for m in (sft, kd)]
        Ls = [L for L in keys[0] if L in keys[1]]  # the study's lengths both measured
        pa, pb = (mean_accuracy({L: k[L] for L in Ls}) if Ls else None for k in keys)
        key = "-" if not Ls else "up" if pb - pa > PASSKEY_MOVES else "down" if pa - pb > PASSKEY_MOVES else "level"
        ahead.append((rec == "above" or key == "up") and not (rec == "below" or key == "down"))
        worse.append(key == "down")
        text.append(f"{label(n, runs[n])}: recovery {interval(a)} after SFT vs {interval(b)} ({rec}), mean passkey "
                    + ("not measured" if not Ls else f"{points(pa)}% vs {points(pb)}% ({key})"))
    if all(ahead):
        verdict = "does not hold"
    elif not any(ahead):
        verdict = "holds" if any(worse) else (f"not settled (it is ahead in no run, but no run's passkey falls by "
                                              f"more than {100 * PASSKEY_MOVES:.0f} points)")
    else:
        verdict = f"not settled (it is ahead in {sum(ahead)} of {len(pairs)} runs)"
    return f"{claim}: {verdict} for the {len(pairs)} run{'s' * (len(pairs) > 1)} measured. " + "; ".join(text)


def is_long(name, run):
    """A run of the long-context comparison: trained with --long_context, or the teacher measured to
    8k beside them (teacher_long); the study's tables leave these out."""
    return bool(run.get("settings", {}).get("long_context")) or name == "teacher_long"


def prompts(run):
    """Prompts behind each NIAH accuracy of a run (one task at one length, every depth): its niah.py
    settings' depths times samples, where the setting is not given niah.py's defaults (5 depths,
    1 sample; 30 with --full)."""
    words = shlex.split(run.get("settings", {}).get("niah") or "")
    opts = dict(w[2:].split("=", 1) for w in words if w.startswith("--") and "=" in w)
    samples = int(opts.get("samples", 30 if "--full" in words else 1))
    return len(opts.get("depths", "0,25,50,75,100").split(",")) * samples


def niah_interval(acc, n):
    """A NIAH accuracy over n prompts as [value, low, high]: Wilson's 95% interval (evaluate.wilson,
    the tasks' own)."""
    from evaluate import wilson

    return [acc, *wilson(round(acc * n), n)]


def gain(base, new):
    """new - base of two accuracies [value, low, high] with Wilson intervals, as [value, low, high]:
    Newcombe's hybrid score interval for a difference of independent proportions (Newcombe 1998,
    Statistics in Medicine 17, method 10), built from the two Wilson intervals."""
    d = new[0] - base[0]
    return [d, d - ((new[0] - new[1]) ** 2 + (base[2] - base[0]) ** 2) ** 0.5,
            d + ((new[2] - new[0]) ** 2 + (base[0] - base[1]) ** 2) ** 0.5]


def baseline(name, run, runs):
    """The name of a long-context run's baseline in runs: the same student, recipe and budget
    (RECIPE) without --long_context; first the run it started from (its "branched_from"), then the
    one whose name it extends (reproduce.py names it <baseline>_long<L>), then any such run; None
    when there is none."""
    s = run["settings"]
    first = [n for n in ((run.get("branched_from") or {}).get("run"), name.rsplit("_long", 1)[0]) if n in runs]
    return next((n for n in first + list(runs) if "teacher" not in runs[n]
                 and not runs[n].get("settings", {}).get("long_context")
                 and all(runs[n].get("settings", {}).get(k) == s.get(k) for k in RECIPE)), None)


def pair_after(base, long):
    """Which measurement a pair is compared on: after SFT (the student as used, and the study's
    passkey) where both have its passkey, else after stage 3 (where the setting acts), else None."""
    for after in ("after_sft", "after_stage3"):
        if all(m.get(after, {}).get("niah", {}).get("s_niah_1") for m in (base, long)):
            return after
    return None


def long_pairs(runs):
    """[(long run's name, baseline's name, after)] of every long-context run with a baseline; after
    may be None (a passkey not measured on both)."""
    out = []
    for n, r in runs.items():
        if r.get("settings", {}).get("long_context") and (b := baseline(n, r, runs)):
            out.append((n, b, pair_after(runs[b], r)))
    return out


def long_teacher(runs):
    """The teacher's run of the long comparison: teacher_long (measured to 8k), else the study's."""
    return runs.get("teacher_long") or runs.get("teacher")


def long_table(runs, pairs):
    """Each long-context run beside its baseline, after stage 3 and after SFT: average recovery,
    KL, and the passkey and UUID by length with Wilson's 95% intervals; the teacher's row first."""
    teacher = long_teacher(runs)
    group = [runs[n] for p in pairs for n in p[:2]] + ([teacher] if teacher else [])
    Ls = sorted({int(L) for r in group for m in measures(r).values() for t in NIAH for L in m["niah"].get(t, {})})
    head = ["run", "after", "Avg recovery [95%]", "KL"] + [f"{NIAH[t]} {L} [95%]" for t in NIAH for L in Ls]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def niah(run, m):
        cells = []
        for t in NIAH:
            acc = m["niah"].get(t, {})
            cells += ["-" if str(L) not in acc else interval(niah_interval(acc[str(L)], prompts(run))) for L in Ls]
        return cells

    if teacher:
        lines.append("| " + " | ".join(["teacher", "-", "-", "0"] + niah(teacher, teacher["teacher"])) + " |")
    for long, base, _ in pairs:
        for after in AFTER:
            for n in (base, long):
                m = runs[n].get(after)
                if m is None:
                    continue
                kl = m["eval"]["model"]["lm"].get("kl")
                cells = [label(n, runs[n]), AFTER[after], interval(m["eval"]["summary"]["recovery"].get("avg")),
                         "-" if kl is None else f"{kl:.3f}"] + niah(runs[n], m)
                lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def long_verdict(runs, pairs):
    """Is the passkey's collapse past the training length the state's limit or the recipe's? Judged
    from each of the seven mixers' long-context run against its baseline (hybrids and SWA are shown,
    not judged: their softmax layers or window are no recurrent state), on the passkey gain
    (long - baseline, Newcombe's 95% interval) at each length beyond TRAINED that both measured:
      "retrieval follows the training length": some non-delta-rule student gains, its interval
        wholly above 0 at some such length;
      "retrieval is bounded by the state": no non-delta-rule student can have gained as much as
        PASSKEY_MOVES (every such interval's top below it; with no non-delta-rule student measured,
        the same of every delta-rule one): long sequences move the passkey only for the delta rule,
        or not at all;
      "not settled": otherwise (an interval that takes in 0 and a gain of PASSKEY_MOVES, or gains
        for delta-rule students alone with no other student to tell the state from the recipe)."""
    claim = ("- Retrieval past the training length: follows the training length, or bounded by the state "
             f"(passkey gain of each long-context run over its baseline at lengths beyond {TRAINED}, Newcombe's 95% "
             f"interval from the two Wilson intervals; follows if a non-delta-rule student's lies above 0, bounded "
             f"if no non-delta-rule student's reaches {100 * PASSKEY_MOVES:.0f} points)")
    judged = []  # (mixer, name, after, [(length, gain)])
    for long, base, after in pairs:
        s = runs[long]["settings"]
        if s.get("mixer") not in ORDER[:7] or s.get("softmax_layers") or after is None:
            continue
        a, b = (runs[n][after]["niah"]["s_niah_1"] for n in (base, long))
        Ls = sorted(int(L) for L in a if str(L) in b and int(L) > TRAINED)
        if Ls:
            acc = [[niah_interval(k[str(L)], prompts(runs[n])) for L in Ls] for k, n in ((a, base), (b, long))]
            judged.append((s["mixer"], long, after, [(L, gain(x, y)) for L, x, y in zip(Ls, *acc)]))
    if not judged:
        return f"{claim}: not measured (no long-context run of the seven mixers with its baseline's passkey " \
               f"beyond {TRAINED} tokens)."
    up = {long: any(g[1] > 0 for _, g in gains) for _, long, _, gains in judged}
    capped = {long: all(g[2] < PASSKEY_MOVES for _, g in gains) for _, long, _, gains in judged}
    other = [long for m, long, _, _ in judged if m not in DELTA]
    delta = [long for m, long, _, _ in judged if m in DELTA]
    if any(up[n] for n in other):
        verdict = "retrieval follows the training length (" + ", ".join(
            NAMES[runs[n]["settings"]["mixer"]] for n in other if up[n]) + ": a gain whose interval lies above 0)"
    elif other and all(capped[n] for n in other):
        moved = [n for n in delta if up[n]]
        verdict = "retrieval is bounded by the state (" + (
            "long sequences move the passkey only for the delta rule: " + ", ".join(
                NAMES[runs[n]["settings"]["mixer"]] for n in moved) if moved else
            "long sequences do not move the passkey") + ")"
    elif not other and any(up[n] for n in delta):
        verdict = ("not settled (only delta-rule students measured, and long sequences move the passkey of "
                   + ", ".join(NAMES[runs[n]["settings"]["mixer"]] for n in delta if up[n])
                   + ": a student of another rule tells the state from the recipe)")
    elif not other and all(capped[n] for n in delta):
        verdict = "retrieval is bounded by the state (long sequences do not move the passkey, even of the delta rule)"
    else:
        wide = [NAMES[runs[n]["settings"]["mixer"]] for n in other or delta if not capped[n]]
        verdict = (f"not settled (the intervals of {', '.join(wide)} take in both 0 and a gain of "
                   f"{100 * PASSKEY_MOVES:.0f} points)")
    text = "; ".join(f"{label(n, runs[n])} ({AFTER[after]}): " + ", ".join(
        f"{L} {100 * g[0]:+.0f} [{100 * g[1]:+.0f}, {100 * g[2]:+.0f}]" for L, g in gains)
        for _, n, after, gains in judged)
    return f"{claim}: {verdict}. Gains in points: {text}"


def long_plot(runs, pairs, path):
    """Passkey accuracy against length after stage 3 and after SFT: each baseline dashed, its
    long-context run solid, a colour a student; the teacher black dotted; the recipe's training
    lengths and each long run's as vertical lines. Returns path."""
    plt = pyplot()

    fig, axes = plt.subplots(1, len(AFTER), figsize=(12, 4), sharey=True)
    colour = {b: f"C{i % 10}" for i, b in enumerate(dict.fromkeys(b for _, b, _ in pairs))}
    teacher = long_teacher(runs)
    for ax, after in zip(axes, AFTER):
        for long, base, _ in pairs:
            for n, ls in ((base, "--"), (long, "-")):
                acc = runs[n].get(after, {}).get("niah", {}).get("s_niah_1")
                if acc:
                    Ls, ys = zip(*by_length(acc))
                    ax.plot(Ls, [100 * a for a in ys], ls=ls, marker="o", color=colour[base], label=label(n, runs[n]))
        acc = teacher and teacher["teacher"]["niah"].get("s_niah_1")
        if acc:
            Ls, ys = zip(*by_length(acc))
            ax.plot(Ls, [100 * a for a in ys], ls=":", marker="x", color="k", label="teacher")
        for L in RECIPE_LENGTHS:
            ax.axvline(L, color="0.6", ls=":", lw=1, label="the recipe's training lengths (512, 1k)")
        for L in sorted({runs[n]["settings"]["long_context"] for n, _, _ in pairs}):
            ax.axvline(L, color="0.3", lw=1, label="long-context training length")
        ax.set_xscale("log", base=2)
        ticks = sorted({int(L) for n in (*[p[0] for p in pairs], *[p[1] for p in pairs])
                        for L in runs[n].get(after, {}).get("niah", {}).get("s_niah_1", {})})
        ax.minorticks_off()
        ax.set_xticks(ticks, [str(L) for L in ticks], fontsize=8)
        ax.set_title(f"passkey, {AFTER[after]}", fontsize=9)
        ax.set_ylim(-3, 103)
        ax.set_xlabel("prompt length (tokens)")
        ax.grid(True, alpha=0.3)
    return save(fig, axes, "passkey accuracy (%)", path)


def long_section(runs, assets, out):
    """report.md's lines on long-context distillation, and the figure's path (None when not drawn)."""
    gdn = STUDY_PASSKEY["gated_deltanet"]
    lines = ["### Long-context distillation: the state's limit or the recipe's?", "",
             f"The study: \"state resolution is a more fundamental bottleneck than the distillation budget\"; its "
             f"evidence: only Gated DeltaNet keeps a passkey at 2k, {gdn[2048]}%, falling to {gdn[4096]}% at 4k after "
             f"10B tokens. Every student here is distilled on {RECIPE_LENGTHS[0]}-token sequences and tuned on "
             f"{RECIPE_LENGTHS[1]:,}; a long-context run trains the last part of stage 3 on longer ones (the same "
             f"tokens), and is set beside its baseline.", ""]
    pairs = long_pairs(runs)
    if not pairs:
        lines.append("Not measured: no long-context run (reproduce.py --long_context) with its baseline.")
        niah = runs["teacher_long"]["teacher"]["niah"] if "teacher_long" in runs else {}
        if niah:
            lengths = " / ".join(str(L) for L, _ in by_length(niah["s_niah_1"]))
            lines.append(f"The teacher at {lengths} tokens (teacher_long): " + "; ".join(
                f"{NIAH[t]} {' / '.join(f'{100 * a:.0f}' for _, a in by_length(acc))}%"
                for t, acc in niah.items() if t in NIAH) + ".")
        return lines + [""], None
    path = long_plot(runs, pairs, os.path.join(assets, "study_long.png"))
    return lines + [long_table(runs, pairs), "",
                    f"![passkey by length, long-context runs against their baselines]"
                    f"({os.path.relpath(path, os.path.dirname(os.path.abspath(out)))})", "",
                    long_verdict(runs, pairs), ""], path


# ---------------------------------------------------------------------------------------------
# Where a run's time goes (reproduce.py's time table, grouped by part of the run)

TRAINING = "training"  # the time table's column of steps proper; every other column is a fixed cost


def time_rows(run):
    """A run's grouped time table ("time_groups", markdown as reproduce.py writes it) as
    {part of the run: {column: seconds}}, its "all" row included; {} when it has none."""
    lines = run.get("time_groups") or []
    if len(lines) < 3:
        return {}
    cols = [c.strip() for c in lines[0].strip("|").split("|")][1:]
    rows = {}
    for line in lines[2:]:
        name, *cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) != len(cols):
            return {}
        try:
            rows[name] = dict(zip(cols, map(float, cells)))
        except ValueError:  # a cell that is no number
            return {}
    return rows if "all" in rows and TRAINING in cols and "total" in cols else {}


def time_label(name, run):
    """A run's name in the time table: what it ran besides the recipe, and where it started."""
    extra = " (and --sft_kd)" if run.get("settings", {}).get("sft_kd") else ""
    b = run.get("branched_from")
    start = f" (from {b['run']}'s stage-3 step {b['stage3_step']:,})" if b else ""
    return label(name, run) + extra + start


def time_section(runs, assets, out):
    """report.md's table of where each run's seconds went (training against the fixed costs, the
    "all" rows of their time tables) and study_time.png, a bar a run split by the same columns;
    ([lines], the figure's path or None)."""
    timed = {n: rows["all"] for n, r in runs.items() if (rows := time_rows(r))}
    names = {n: time_label(n, runs[n]) for n in timed}
    lines = ["### Where each run's time went", ""]
    if not timed:
        return lines + ["No run has a time table (reproduce.py writes one into its JSON).", ""], None
    # every column of any run's table (a column a run lacks reads "-"), in the tables' order
    fixed = [c for c in dict.fromkeys(c for all_ in timed.values() for c in all_) if c not in (TRAINING, "total")]
    lines += ["Seconds by each run's time table (its steps' own clocks; \"process\" is each step's time outside it), "
              "training proper against the fixed costs:", "",
              "| run | machine, date, commit | " + " | ".join([TRAINING, "fixed costs"] + fixed + ["total"]) + " |",
              "|" + "---|" * (len(fixed) + 5)]
    for n, all_ in timed.items():
        r = runs[n]
        gpu = r["machine"].split(",")[0]
        lines.append(f"| {names[n]} | {gpu}, {r['date']}, {r['commit']} | {all_[TRAINING]:.0f} "
                     f"({100 * all_[TRAINING] / all_['total']:.0f}%) | {all_['total'] - all_[TRAINING]:.0f} | "
                     + " | ".join(f"{all_[c]:.0f}" if c in all_ else "-" for c in fixed) + f" | {all_['total']:.0f} |")
    plt = pyplot()

    order = list(timed)[::-1]  # the study's order from the top
    fig, ax = plt.subplots(figsize=(11, 0.45 * len(order) + 1.6))
    left = [0.0] * len(order)
    for i, col in enumerate([TRAINING] + fixed):
        widths = [timed[n].get(col, 0.0) for n in order]
        ax.barh(range(len(order)), widths, left=left, color=f"C{i}", label=col)
        left = [a + b for a, b in zip(left, widths)]
    for y, n in enumerate(order):
        ax.text(left[y] + 8, y, f"{timed[n]['total']:.0f} s", va="center", fontsize=8,
                bbox=dict(facecolor="white", edgecolor="none", pad=1))
    ax.set_yticks(range(len(order)), [names[n] for n in order], fontsize=8)
    ax.axvline(900, color="k", lw=0.8, ls="--", zorder=0)
    ax.text(905, len(order) - 0.5, "15 min", fontsize=8, va="bottom")
    ax.set_xlim(0, max(max(left) * 1.12, 960))
    ax.set_xlabel("seconds, by each run's time table")
    path = save(fig, [ax], "", os.path.join(assets, "study_time.png"))
    return lines + ["", f"![where each run's time went]({os.path.relpath(path, os.path.dirname(os.path.abspath(out)))})",
                    ""], path


def study_lengths(acc):
    """A NIAH result {"512": accuracy, ...} at the study's lengths alone (to STUDY_LONGEST)."""
    return {L: a for L, a in acc.items() if int(L) <= STUDY_LONGEST}


def passkey(run):
    """(passkey accuracy by length after SFT, False), or (after stage 3, True) for a run whose
    NIAH after SFT did not finish, or (None, False); at the study's lengths alone (to 4k)."""
    for after in ("after_sft", "after_stage3"):
        p = study_lengths(run[after]["niah"].get("s_niah_1") or {}) if after in run else None
        if p:
            return p, after == "after_stage3"
    return None, False


def passkey_mean(run):
    """passkey() with the accuracy averaged over the lengths."""
    p, late = passkey(run)
    return (None if p is None else mean_accuracy(p)), late


def recovery(run):
    """Average recovery after stage 3 [value, low, high], or None."""
    return run["after_stage3"]["eval"]["summary"]["recovery"].get("avg") if "after_stage3" in run else None


ADDED_ARMS = ("maturity", "sft_kd")  # settings that add work beside a run and change none of its stages


def recipe(run):
    """What a run trains and measures: its settings but the added arms (maturity points keep weights
    along stage 3, sft_kd fine-tunes a second copy of its stage-3 student) and its NIAH lengths past
    the study's (--long_niah measures to 8k beside the same ones), or its command where it has no
    settings."""
    if "settings" not in run:
        return run.get("command")
    out = {k: v for k, v in run["settings"].items() if k not in ADDED_ARMS}
    out["steps"] = {k: v for k, v in out.get("steps", {}).items() if k not in ADDED_ARMS}
    if isinstance(out.get("niah"), str):
        out["niah"] = re.sub(r"--lengths=([\d,]+)", lambda m: "--lengths=" + ",".join(
            study_lengths(dict.fromkeys(m.group(1).split(",")))), out["niah"])
    return out


def replicates(runs, earlier):
    """{name: (run, its earlier run)}: the students run twice with the same recipe."""
    return {n: (r, earlier[n]) for n, r in runs.items() if n in earlier and n != "teacher"
            and recipe(r) == recipe(earlier[n])}


def differences(pairs):
    """{"recovery": [..], "passkey": [..]}: each student's |this run - its earlier run| (fractions)."""
    out = {"recovery": [], "passkey": []}
    for run, old in pairs.values():
        a, b = recovery(run), recovery(old)
        if a and b:
            out["recovery"].append(abs(a[0] - b[0]))
        (pa, _), (pb, _) = passkey_mean(run), passkey_mean(old)
        if pa is not None and pb is not None:
            out["passkey"].append(abs(pa - pb))
    return out


def noise(pairs):
    """The run-to-run noise of each measure: the largest difference between two runs of one
    command, or None without a student run twice; and "students", how many it is taken over."""
    d = differences(pairs)
    return {**{k: max(v, default=None) for k, v in d.items()}, "students": len(pairs)}


def replicate_table(pairs):
    """Each student run twice: average recovery after stage 3 and mean passkey accuracy (after SFT;
    after stage 3 where that run's NIAH after SFT did not finish, marked *) in both runs, and the
    difference (this run minus the earlier one, in points)."""
    head = ["run", "dates (earlier, this)", "Avg recovery after stage 3 [95%]", "earlier", "difference", "mean passkey",
            "earlier", "difference"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for n, (run, old) in pairs.items():
        (a, b), (pa, pb) = (recovery(run), recovery(old)), (passkey_mean(run), passkey_mean(old))
        when = f"{old['date']}, {run['date']}"
        cells = [label(n, run), when, interval(a), interval(b),
                 "-" if not (a and b) else f"{100 * (a[0] - b[0]):+.1f}"]
        cells += ["-" if p is None else f"{100 * p:.1f}" + "*" * cut for p, cut in (pa, pb)]
        cells.append("-" if pa[0] is None or pb[0] is None else f"{100 * (pa[0] - pb[0]):+.1f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def findings(runs, floor=None):
    """The study's findings, each with its numbers and a verdict. floor: noise()'s run-to-run
    difference of each measure (None: no student run twice), under which a gap between two
    students is not a finding."""
    out, floor = [], floor or {}
    rec_floor, key_floor = floor.get("recovery"), floor.get("passkey")

    def rec(name):
        return recovery(runs[name]) if name in runs else None

    pairs = [(u, g, rec(u), rec(g)) for u, g in GATED.items()]
    known = [p for p in pairs if p[2] and p[3]]

    def judge(a, b):  # a: the ungated twin's [mean, low, high], b: the gated one's
        if rec_floor is not None and abs(b[0] - a[0]) <= rec_floor:
            return "within the run-to-run difference"
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
        why = []
        for what, says in (("intervals overlap", "the 95% intervals"), ("within the run-to-run difference",
                                                                        "the gaps")):
            n = judged.count(what)
            of = "" if n == len(known) else f" of {n} of {len(known)} pairs"
            if n:
                why.append(f"{says}{of} " + ("overlap" if what == "intervals overlap" else "lie within the "
                                                                                         "run-to-run difference"))
        verdict = f"not settled at this budget ({'; '.join(why)})"
    if known and len(known) < len(pairs):
        verdict += f" for the {len(known)} of {len(pairs)} pairs measured"
    out.append(f"- Gated beats ungated (average recovery after stage 3): {verdict}. {text}{spread(rec_floor, floor) if known else ''}".rstrip())

    got = {n: passkey(runs.get(n) or {}) for n in ORDER[:7]}
    seven = [n for n in ORDER[:7] if got[n][0]]
    cut = [n for n in seven if got[n][1]]  # stand in with their NIAH after stage 3, marked
    mean = {n: mean_accuracy(got[n][0]) for n in seven}
    ci = {n: niah_interval(mean[n], prompts(runs[n]) * len(got[n][0])) for n in seven}  # every prompt pooled
    ranks = ", ".join(f"{NAMES[n]} {with_interval(ci[n])}" + (" (after stage 3)" if n in cut else "")
                      for n in sorted(mean, key=mean.get, reverse=True))
    study = {n: mean_accuracy(a) for n, a in STUDY_PASSKEY.items() if len(a) == 4}  # every length reported
    ranks += "; the study at 10B tokens: " + ", ".join(f"{NAMES[n]} {study[n]:.0f}%" for n in
                                                        sorted(study, key=study.get, reverse=True))
    claim = ("Gated DeltaNet keeps retrieval best (mean passkey accuracy over lengths, after SFT, with Wilson's 95% "
             "interval over all its prompts; holds if Gated DeltaNet's lies above every other student's)")
    if len(seven) < 7:
        out.append(f"- {claim}: not measured ({len(seven)} of the seven mixers measured). {ranks}".rstrip())
    else:
        # holds: Gated DeltaNet's interval above every other's; does not hold: another's above its
        gdn, others = ci["gated_deltanet"], [n for n in seven if n != "gated_deltanet"]
        rival = max(others, key=mean.get)  # the gap that decides it: its lead over the next, or the best's over it
        verdict = "holds" if gdn[1] > max(ci[n][2] for n in others) else \
            "does not hold" if any(ci[n][1] > gdn[2] for n in others) else \
            (f"not settled (Gated DeltaNet {with_interval(gdn)} against {NAMES[rival]} "
             f"{with_interval(ci[rival])}: the 95% intervals overlap)")
        if key_floor is not None and abs(mean["gated_deltanet"] - mean[rival]) <= key_floor:
            verdict = (f"not settled (Gated DeltaNet {points(mean['gated_deltanet'])}% against "
                       f"{points(mean[rival])}%, a gap within the run-to-run difference)")
        if cut:
            verdict += ", with " + " and ".join(NAMES[n] for n in cut) + " judged after stage 3 (after SFT not measured)"
        out.append(f"- {claim}: {verdict}. {ranks}{spread(key_floor, floor)}")
    for n in ("linear_attention", "retnet"):
        p, late = passkey(runs.get(n) or {})
        when = "after stage 3; after SFT not measured" if late else "after SFT"
        if not p:
            out.append(f"- {NAMES[n]} loses retrieval past 512 tokens: not measured.")
            continue
        acc, n_prompts = dict(by_length(p)), prompts(runs[n])
        past = {L: a for L, a in acc.items() if L > 512}
        verdict = "not measured" if not past else "holds" if max(past.values()) <= COLLAPSE else "does not hold"
        if verdict == "holds" and acc.get(512, 1) <= COLLAPSE:
            verdict += f", and it finds at most {100 * COLLAPSE:.0f}% at 512 too"
        study = ", ".join(f"{L}: {a:.0f}%" for L, a in STUDY_PASSKEY[n].items())
        out.append(f"- {NAMES[n]} loses retrieval past 512 tokens (passkey at most {100 * COLLAPSE:.0f}% at each "
                   f"longer length, {when}): {verdict}. "
                   + ", ".join(f"{L}: {with_interval(niah_interval(a, n_prompts))}" for L, a in acc.items())
                   + f" (the study at 10B tokens: {study})")
    out += [gaps(runs), instruction_aware(runs)]
    return "\n".join(out)


def spread(value, floor):
    """The run-to-run difference a finding was judged against, as a clause of its text."""
    n = floor.get("students", 0)
    return ("; no student run twice, so no run-to-run difference" if value is None else
            f"; run-to-run difference {100 * value:.1f} points (the largest of {n} student{'s' * (n > 1)} run twice)")


def save(fig, axes, ylabel, path):
    """A row of panels finished (the y label, one legend of every line's label, right of the last
    panel) and written to path."""
    plt = pyplot()

    axes[0].set_ylabel(ylabel)
    legend = {}  # label -> handle, in the order the panels first show them
    for ax in axes:
        for handle, label_ in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(label_, handle)
    if legend:
        axes[-1].legend(legend.values(), legend.keys(), fontsize=7, handlelength=4, loc="upper left", bbox_to_anchor=(1.02, 1))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plots(runs, assets):
    """study_recovery.png, study_niah.png, study_loss.png and (when a student the study measured is
    here) study_passkey.png under assets; returns their paths."""
    plt = pyplot()

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

    # maturity: each student with maturity points, from them to its end after stage 3; written
    # only when some point measured LAMBADA or the passkey at 512 / 1k / 2k
    grown = {n: curve(r) for n, r in students.items() if "maturity" in r}
    if grown:
        fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
        drawn = False
        panels = (("LAMBADA recovery", lambda m: (m["eval"]["summary"]["recovery"].get("lambada") or [None])[0]),
                  ("passkey, mean of 512 / 1k / 2k", short_passkey))
        for ax, (title, value) in zip(axes, panels):
            for n, pts in grown.items():
                xy = [(t, 100 * v) for t, m in pts.items() if (v := value(m)) is not None and v == v]
                if len(xy) > 1:  # the end alone is no curve
                    ax.plot(*zip(*xy), marker="o", label=label(n, students[n]), **style[n])
                    drawn = True
            ax.set_xscale("log")
            ax.minorticks_off()
            ticks = sorted({t for pts in grown.values() for t in pts})  # the tokens measured, as people write them
            ax.set_xticks(ticks, [count(t) for t in ticks], fontsize=8)
            ax.set_title(title, fontsize=9)
            ax.set_xlabel("distillation tokens (stages 1-3)")
            ax.grid(True, alpha=0.3)
        axes[1].set_ylabel("accuracy (%)")
        axes[1].set_ylim(-3, 103)
        if drawn:
            paths.append(save(fig, axes, "recovery (%)", os.path.join(assets, "study_maturity.png")))
        plt.close(fig)
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
            key = m and study_lengths(m["niah"].get("s_niah_1", {}))
            cells += [pct(rec) if rec else "-", f"{100 * mean_accuracy(key):.0f}" if key else "-"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", default=os.path.join(ROOT, "results", "study"), help="reproduce.py's JSON files")
    ap.add_argument("--out", default=None, help="the report (default <results>/report.md)")
    ap.add_argument("--assets", default=os.path.join(ROOT, "assets"), help="where the plots go")
    ap.add_argument("--budgets", default="", help="folders of runs at other budgets, comma-separated: a table by budget")
    ap.add_argument("--earlier", default=None, help="earlier runs of the same recipes (default <results>/earlier)")
    args = ap.parse_args(argv)
    folders = [args.results] + [f for f in args.budgets.split(",") if f]
    loaded = [load(f) for f in folders]
    # the study's tables and findings: every run but the long-context comparison's (its own section)
    study = [{n: r for n, r in runs.items() if not is_long(n, r)} for runs in loaded]
    for f, r in zip(folders, study):
        if not [n for n in r if n != "teacher"]:
            sys.exit(f"report.py: no student results in {f} (scripts/reproduce.py writes them)")
    runs = study[0]
    earlier_dir = args.earlier or os.path.join(args.results, "earlier")
    earlier = load(earlier_dir) if os.path.isdir(earlier_dir) else {}
    pairs = replicates(runs, earlier)
    os.makedirs(args.assets, exist_ok=True)
    lines = []
    for after, title in AFTER.items():
        lines += [f"### {title[0].upper() + title[1:]}", "", table(runs, after), ""]
    if len(loaded) > 1:
        lines += ["### By budget: average recovery and mean passkey accuracy after SFT (%)", "",
                  budget_table(study), ""]
    out = args.out or os.path.join(args.results, "report.md")
    drawn = plots(runs, args.assets)
    figure = os.path.join(args.assets, "study_maturity.png")
    lines += ["### Maturity: LAMBADA and the passkey through distillation", ""]
    if figure in drawn:
        lines += ["LAMBADA recovery and mean passkey accuracy (512 / 1k / 2k) at the points measured inside stage 3 "
                  "and at its end, by distillation tokens: "
                  f"![maturity]({os.path.relpath(figure, os.path.dirname(os.path.abspath(out)))})", ""]
    elif any("maturity" in r for r in runs.values()):
        lines += ["No maturity point measured LAMBADA or the passkey at 512 / 1k / 2k: no figure.", ""]
    else:
        lines += ["No run has maturity points (evaluations inside stage 3): no figure.", ""]
    lines += ["### Instruction-aware distillation against SFT", ""]
    if any("after_sft_kd" in r and "after_sft" in r for r in runs.values()):
        lines += ["From the same stage-3 student, on the same chat data and budget: SFT, and SFT with KL to the "
                  "instruction-tuned teacher on the assistant's tokens. KL is to the teacher on held-out text.", "",
                  kd_table(runs), ""]
    else:
        lines += ["No run has instruction-aware distillation (after_sft_kd).", ""]
    lines += ["### Replicates: the students run twice", ""]
    if pairs:
        rel = os.path.relpath(earlier_dir, os.path.dirname(os.path.abspath(out)))
        lines += [f"The same recipe run again (the earlier run kept in [{rel}/]({rel})); mean passkey accuracy over "
                  "lengths to 4k after SFT (* after stage 3: that run's NIAH after SFT did not finish); differences in "
                  "points, this run minus the earlier.", "", replicate_table(pairs), ""]
    else:
        lines += ["No student has been run twice with the same recipe.", ""]
    section, long_figure = long_section(loaded[0], args.assets, out)
    times, time_figure = time_section(loaded[0], args.assets, out)
    lines += section + times + ["### The study's findings here", "", findings(runs, noise(pairs)), "", "Runs:", ""]
    drawn += [f for f in (long_figure, time_figure) if f]
    for folder in loaded + [{n: old for n, (_, old) in pairs.items()}]:
        for n, r in folder.items():
            spent = sum(r.get("seconds", {}).values())  # every step's, across resumes after a kill
            lines.append(f"- {label(n, r)}{' (earlier run)' if r is earlier.get(n) else ''}: {r['machine']}, "
                         f"{r['date']}, commit {r['commit']}: `{r['command']}`"
                         + (f", {spent:,.0f} s in its steps" if spent else "")
                         + (f", started from {b['run']}'s stage 3 at step {b['stage3_step']:,}"
                            if (b := r.get("branched_from")) else "")
                         + (f". Incomplete: {r['incomplete']}" if r.get("incomplete") else ""))
    report = "\n".join(lines) + "\n"
    with open(out, "w") as f:
        f.write(report)
    print(report)
    for p in drawn:
        print(f"plot: {p}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
