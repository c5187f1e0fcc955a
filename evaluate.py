"""
Language-modelling evaluation of the teacher or a student: perplexity and KL to the teacher on
held-out text, the study's zero-shot tasks with 95% confidence intervals, and teacher recovery.

    python evaluate.py                                             # the offline teacher
    python evaluate.py --init_from=out/gated_deltanet/stage3.pt    # a student, against the teacher
    python evaluate.py --mixer=gla --mc_limit=50                   # an untrained student (smoke test)
    python evaluate.py --mc_source=hub --mc_limit=0                # the same tasks from the hub, all
    python evaluate.py --init_from=S.pt --teacher_eval=earlier.json   # the teacher's scores from an earlier --out
    python evaluate.py --init_from=S.pt --vs_teacher=false         # a student alone, no teacher loaded

The model is --teacher (--init_from=teacher, the default), a new student of it (--mixer), or a
checkpoint (--init_from=<checkpoint>), as in sample.py and niah.py; a student is measured
against --teacher (KL, the teacher's scores, recovery) unless --vs_teacher=false.

Held-out text: perplexity = exp of the mean next-token cross-entropy over windows of --seq_len
tokens of --data (default data/modern/val.bin). KL: mean over predicted positions of
KL(teacher || student) = sum_v p_teacher(v) (log p_teacher(v) - log p_student(v)), in nats.

Tasks: the study's LAMBADA, ARC-Easy, ARC-Challenge, PIQA, HellaSwag and WinoGrande, zero-shot,
and MMLU as an extra, prompted and scored as lm-evaluation-harness does (data/mc_offline/prepare.py
says which split of each and how it is rendered). Every answer choice is a (context,
continuation) pair scored by ll = sum of log p(continuation tokens | context).
  acc       the choice with the highest ll is the gold one
  acc_norm  the same with ll / len(choice): the choice's length in characters, without the
            space that joins it to the context (the harness's acc_norm); removes the bias
            towards short answers
  LAMBADA   acc: greedy decoding reproduces every token of the last word; perplexity: exp of
            the mean over passages of -ll(last word) (the harness's lambada `perplexity`)
  MMLU      acc over all its questions (the harness's group: a micro average over subjects)
One rule picks each task's score, in the table and in Avg: acc_norm for ARC-Challenge and
HellaSwag, acc for every other task (as in the zero-shot tables of Mamba, arXiv 2312.00752,
which later linearization papers follow). Avg is the mean score of the study's
six tasks; MMLU is shown beside it, not in it. Recovery = student score / teacher score, per
task and for Avg (the ratio of the two Avgs).
95% intervals: Wilson's score interval for a task's accuracy; for Avg a percentile bootstrap
over questions (1,000 resamples, seed 0, each task resampled on its own); for recovery the same
bootstrap with teacher and student resampled together, question by question (paired), so that
what the two models share does not count as noise. LAMBADA's perplexity has no interval.
--mc_limit keeps an evenly spaced subset of every task, the same questions for both models.
--teacher_eval takes the teacher's task scores from an earlier --out of the same settings (a
student's, or the teacher's own) instead of measuring them again: the teacher is fixed, and
they are half of a student's evaluation. Its held-out loss is still measured (KL needs the
teacher's predictions there) and must agree with the file's, or the run stops.

References: What Matters in Linearizing Language Models? arXiv 2504.14366 (tasks, recovery);
EleutherAI lm-evaluation-harness (prompts, acc, acc_norm, LAMBADA); AI2's OLMo in-loop evaluation
(data); E. B. Wilson, JASA 22 (1927) (interval); Efron & Tibshirani, An Introduction to the
Bootstrap (1993).
"""

import json
import math
import os
import sys
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.nn.functional as F

import checkpoint
import cli
from data import read_tokens
from data.mc_offline import prepare as mc

ROOT = os.path.dirname(os.path.abspath(__file__))
STUDY = {"lambada": "acc", "arc_easy": "acc", "arc_challenge": "acc_norm", "piqa": "acc",
         "hellaswag": "acc_norm", "winogrande": "acc"}  # the study's tasks and the score of each
TASKS = ",".join([*STUDY, "mmlu"])
NAMES = {"lambada": "LAMBADA", "arc_easy": "ARC-E", "arc_challenge": "ARC-C", "piqa": "PIQA",
         "hellaswag": "HellaSwag", "winogrande": "WinoGrande", "mmlu": "MMLU"}
Z95 = 1.959964  # the standard normal's 97.5% quantile
BOOT, SEED = 1000, 0  # bootstrap resamples and their seed


@dataclass
class Settings(checkpoint.ModelSettings):  # the model's settings first: --init_from, --mixer, ...
    # --- the reference: a student's KL and recovery are measured against --teacher ---
    vs_teacher: bool = True  # a student against --teacher (KL, the teacher's scores, recovery);
    #   false: the model alone
    teacher_eval: str = ""  # an earlier --out with these settings: the teacher's task scores are
    #   read from it, not measured again
    # --- held-out text ---
    data: str = os.path.join(ROOT, "data", "modern", "val.bin")  # uint16 token file
    seq_len: int = 512  # window length for perplexity (the study trains at 512)
    max_windows: int = 16  # windows of --data, evenly spaced (on a GPU: 256)
    # --- tasks ---
    tasks: str = TASKS  # comma-separated; empty for none
    mc_source: str = "offline"  # offline (data/mc_offline/) or hub (through `datasets`)
    mc_dir: str = os.path.join(ROOT, "data", "mc_offline")  # offline task files
    mc_limit: int = 50  # questions per task, evenly spaced; 0 = all (on a GPU: 0)
    batch_size: int = 4  # sequences per forward (on a GPU: 64)
    task_tokens: int = 0  # the tasks' forwards: as many rows as fit this many tokens, 0: batch_size
    # rows (on a GPU: 32768, where short questions 64 to a forward left it waiting on the host)
    out: str = ""  # write the results here as JSON


GPU_DEFAULTS = {**checkpoint.GPU_DEFAULTS, "max_windows": 256, "mc_limit": 0, "batch_size": 64,
                "task_tokens": 32768}
RULES = [("mc_limit", lambda v: v >= 0, "a number of questions, or 0 for all"),
         ("task_tokens", lambda v: v >= 0, "a number of tokens, or 0 for batch_size rows"),
         ("mc_source", lambda v: v in ("offline", "hub"), "offline or hub")] + [
    (k, lambda v: v >= 1, "an integer >= 1") for k in ("seq_len", "max_windows", "batch_size")]


def fail(msg):
    """A setting that cannot work: one line on stderr and status 2, before any model loads."""
    print(f"evaluate.py: error: {msg}", file=sys.stderr)
    raise SystemExit(2)


def settings(argv=None):
    """The run's Settings from the command line (--help lists them), checked, and its tasks."""
    s, _ = cli.settings(sys.argv[1:] if argv is None else argv, Settings, fail, GPU_DEFAULTS)
    if s.teacher == "none":
        fail("--teacher=none: --teacher is the softmax teacher (anything checkpoint.load takes); "
             "--vs_teacher=false evaluates the model alone")
    checkpoint.check_settings(s, fail)
    cli.check(s, RULES, fail)
    tasks = [t for t in s.tasks.split(",") if t]
    unknown = [t for t in tasks if t not in NAMES]
    if s.mc_source == "hub" and unknown:
        fail(f"--tasks: {', '.join(unknown)} not on the hub path; known: {TASKS}")
    return s, tasks


# ---------------------------------------------------------------------------------------------
# Perplexity and KL on held-out tokens


@torch.no_grad()
def lm_metrics(net, data, seq_len, max_windows, batch_size=4, teacher=None):
    """{'tokens', 'loss', 'ppl'[, 'kl', 'teacher_loss']} over up to max_windows evenly spaced
    windows of data."""
    n = min(max_windows, (len(data) - 1) // seq_len)
    starts = np.linspace(0, len(data) - seq_len - 1, n).astype(np.int64)
    device = next(net.parameters()).device
    nll = kl = t_nll = 0.0
    for b in range(0, n, batch_size):
        x = torch.stack([torch.from_numpy(np.asarray(data[s:s + seq_len + 1], dtype=np.int64)) for s in starts[b:b + batch_size]])
        x = x.to(device)  # (B, T + 1): inputs x[:, :-1], targets x[:, 1:]
        logp = F.log_softmax(net(x[:, :-1]).float(), -1)  # (B, T, V)
        nll -= logp.gather(-1, x[:, 1:, None]).sum().item()
        if teacher is not None:
            logq = F.log_softmax(teacher(x[:, :-1]).float(), -1)  # teacher's log probabilities
            kl += (logq.exp() * (logq - logp)).sum().item()  # summed over vocabulary and positions
            t_nll -= logq.gather(-1, x[:, 1:, None]).sum().item()
    tokens = n * seq_len
    out = {"tokens": tokens, "loss": nll / tokens, "ppl": float(np.exp(nll / tokens))}
    if teacher is not None:
        out["kl"] = kl / tokens  # per token (the study's code summed over positions: see distill.kl_per_token)
        out["teacher_loss"] = t_nll / tokens
    return out


# ---------------------------------------------------------------------------------------------
# Zero-shot tasks


def batches(rows, size, tokens=0):
    """Consecutive slices of rows (sequences, longest first): `size` rows each, or with tokens > 0
    as many as fit `tokens` padded to the slice's first (longest) row, at least one."""
    b = 0
    while b < len(rows):
        n = size if tokens <= 0 else max(1, tokens // len(rows[b]))
        yield rows[b:b + n]
        b += n


@torch.no_grad()
def loglikelihoods(net, tok, requests, batch_size=4, max_len=2048, tokens=0):
    """[(context, continuation)] -> [(sum log p(continuation | context), greedy)], where greedy
    says whether argmax decoding would have produced the continuation exactly. Requests whose
    forward inputs agree (all their tokens but the last, as MMLU's " A" .. " D") share one row.
    A forward takes batch_size rows, or with tokens > 0 as many as fit that many (batches)."""
    device = next(net.parameters()).device
    enc, rows = [], {}
    for i, (ctx, cont) in enumerate(requests):
        c, x = tok.encode(ctx) or [tok.eot_id], tok.encode(cont)  # an empty context starts at <|endoftext|>
        ids = (c + x)[-max_len - 1:]
        enc.append((ids, len(x)))
        rows.setdefault(tuple(ids[:-1]), []).append(i)  # the input; the last token is only a target
    inputs = sorted(rows, key=len, reverse=True)  # similar lengths share a batch
    out = [(0.0, True)] * len(enc)  # an empty continuation: log p 0, greedy
    for batch in batches(inputs, batch_size, tokens):
        x = torch.zeros(len(batch), max(map(len, batch)), dtype=torch.long)
        who, row, pos, target = [], [], [], []  # one entry per scored token of the batch
        for r, inp in enumerate(batch):  # right padding: a causal model never looks at it
            x[r, :len(inp)] = torch.tensor(inp)
            for i in rows[inp]:
                ids, n = enc[i]
                who += [i] * n
                row += [r] * n
                pos += range(len(ids) - 1 - n, len(ids) - 1)  # positions predicting the continuation
                target += ids[len(ids) - n:]
        h = net.hidden(x.to(device))[torch.tensor(row, device=device), torch.tensor(pos, device=device)]
        logp = F.log_softmax(net.lm_head(h).float(), -1)  # (scored tokens, V): the head on those alone
        t = torch.tensor(target, device=device)
        lp, hit = logp.gather(-1, t[:, None])[:, 0], logp.argmax(-1) == t
        lp, hit = lp.tolist(), hit.tolist()  # one transfer a batch
        for i, p, h in zip(who, lp, hit):
            out[i] = (out[i][0] + p, out[i][1] and h)
    return out


def wilson(k, n, z=Z95):
    """Wilson's score interval (lo, hi) for k successes in n trials."""
    if n == 0:
        return (float("nan"), float("nan"))
    p, d = k / n, 1 + z * z / n
    centre = (p + z * z / (2 * n)) / d
    half = z / d * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return (max(0.0, centre - half), min(1.0, centre + half))


def scored(hits):
    """{'score', 'ci', 'hits'} of a list of 0/1 per question; hits is kept as a string '0110...'."""
    k, n = sum(hits), len(hits)
    return {"score": k / n, "ci": wilson(k, n), "hits": "".join(map(str, hits))}


def choice_len(cont):
    """The harness's acc_norm length: characters of the choice, without the joining space."""
    return max(1, len(cont) - cont.startswith(" "))


def mc_accuracy(net, tok, questions, batch_size=4, tokens=0):
    """{'n', 'acc', 'acc_norm'} for questions [{'requests': [(context, continuation)], 'gold'}];
    acc and acc_norm are {'score', 'ci', 'hits'} (see scored). batch_size, tokens: loglikelihoods'."""
    flat = [tuple(r) for q in questions for r in q["requests"]]
    scores = iter(loglikelihoods(net, tok, flat, batch_size, tokens=tokens))
    acc, acc_norm = [], []
    for q in questions:
        lp = [next(scores)[0] for _ in q["requests"]]
        norm = [s / choice_len(cont) for s, (_, cont) in zip(lp, q["requests"])]
        acc.append(int(np.argmax(lp) == q["gold"]))
        acc_norm.append(int(np.argmax(norm) == q["gold"]))
    return {"n": len(questions), "acc": scored(acc), "acc_norm": scored(acc_norm)}


def cloze(net, tok, docs, batch_size=4, tokens=0):
    """LAMBADA: {'n', 'acc', 'ppl'} for docs [{'context', 'continuation'}]: acc counts greedy
    hits; ppl = exp(mean over docs of -log p(continuation | context))."""
    got = loglikelihoods(net, tok, [(d["context"], d["continuation"]) for d in docs], batch_size, tokens=tokens)
    return {"n": len(docs), "acc": scored([int(g) for _, g in got]),
            "ppl": float(np.exp(-np.mean([lp for lp, _ in got])))}


def subset(items, limit):
    """`limit` evenly spaced items (all when limit is 0 or not smaller): a fixed subset that
    spans the file (MMLU's subjects come one after another)."""
    if not limit or limit >= len(items):
        return items
    return [items[i * len(items) // limit] for i in range(limit)]


def load_offline(task, folder):
    path = os.path.join(folder, f"{task}.jsonl")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} missing: run python data/mc_offline/prepare.py (offline tasks: {TASKS})")
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def _arc(d):
    return mc.arc(d["question"], d["choices"]["text"], d["choices"]["label"].index(d["answerKey"]))


HUB = {  # task: (dataset, config, split, row -> question), what the harness loads; rendered as offline
    "lambada": ("EleutherAI/lambada_openai", "default", "test", lambda d: mc.lambada(d["text"])),
    "arc_easy": ("allenai/ai2_arc", "ARC-Easy", "test", _arc),
    "arc_challenge": ("allenai/ai2_arc", "ARC-Challenge", "test", _arc),
    "piqa": ("baber/piqa", None, "validation", mc.piqa),  # a script-free copy of ybisk/piqa, as the harness uses
    "hellaswag": ("Rowan/hellaswag", None, "validation", mc.hellaswag),
    "winogrande": ("allenai/winogrande", "winogrande_xl", "validation", mc.winogrande),
    "mmlu": ("hails/mmlu_no_train", "all", "test", mc.mmlu),
}


def load_hub(task):
    """A task through `datasets` (needs the hub), in the offline format."""
    from datasets import load_dataset

    path, config, split, render = HUB[task]
    return [{"id": i, **render(d)} for i, d in enumerate(load_dataset(path, config, split=split))]


# ---------------------------------------------------------------------------------------------
# The table: one row per model, the study's score per task, Avg, and recovery


def resample_means(hits, rng, n_boot=BOOT):
    """(n_boot, models) means of bootstrap resamples of the questions, hits (questions, models)
    0/1. A resample only counts how often each distinct row of hits is drawn, so it is one
    multinomial draw over those rows; a row keeps the models of a question together (paired)."""
    rows, counts = np.unique(hits, axis=0, return_counts=True)
    draws = rng.multinomial(len(hits), counts / len(hits), size=n_boot)  # (n_boot, distinct rows)
    return draws @ rows / len(hits)


def metric(task):
    """The score a task is reported with: the study's rule (STUDY), acc for any other task."""
    return STUDY.get(task, "acc")


def summarize(results, names):
    """The table's numbers for results, per-model result dicts on the same questions (teacher
    first): {'tasks', 'avg_of', 'rows': {name: {task or 'avg': (score, lo, hi), 'lambada_ppl'}},
    'recovery': {task or 'avg': (ratio, lo, hi)}} (recovery only for two models)."""
    tasks = [t for t in results[0] if t != "lm"]
    study = [t for t in tasks if t in STUDY]
    hits = {t: np.array([[int(c) for c in r[t][metric(t)]["hits"]] for r in results]).T for t in tasks}  # (questions, models)

    def boot(cols, over):  # {task: (BOOT, len(cols)) resampled means}, plus 'avg' over the study's tasks
        rng = np.random.default_rng(SEED)  # the same draws whatever else is in the table
        b = {t: resample_means(hits[t][:, cols], rng) for t in over}
        if study:
            b["avg"] = np.mean([b[t] for t in study], 0)  # each task resampled on its own
        return b

    out = {"tasks": tasks, "avg_of": study, "rows": {}, "recovery": {}}
    for j, (name, res) in enumerate(zip(names, results)):
        row = {t: (res[t][metric(t)]["score"], *res[t][metric(t)]["ci"]) for t in tasks}
        if study:
            row["avg"] = (float(np.mean([row[t][0] for t in study])), *np.percentile(boot([j], study)["avg"][:, 0], [2.5, 97.5]))
        if "lambada" in res:
            row["lambada_ppl"] = res["lambada"]["ppl"]
        out["rows"][name] = row
    if len(results) == 2:  # recovery of the student (column 1) against the teacher (column 0), paired
        paired = boot([0, 1], tasks)
        for t in paired:
            ref, got = out["rows"][names[0]][t][0], out["rows"][names[1]][t][0]
            out["recovery"][t] = (got / ref if ref > 0 else float("nan"), *ratio_interval(paired[t]))
    return out


def ratio_interval(boot):
    """95% percentile interval of student / teacher, boot (resamples, [teacher, student]) means;
    resamples in which the teacher scores 0 have no ratio and are left out."""
    ok = boot[:, 0] > 0
    if not ok.any():
        return (float("nan"), float("nan"))
    return tuple(np.percentile(boot[ok, 1] / boot[ok, 0], [2.5, 97.5]))


def markdown(summary):
    """The summary as a markdown table: ppl, the tasks of Avg, Avg, then the others (MMLU)."""
    study, extra = summary["avg_of"], [t for t in summary["tasks"] if t not in STUDY]
    cols = study + (["avg"] if study else []) + extra
    head = [("Avg" if len(study) == len(STUDY) else f"Avg ({len(study)} tasks)") if t == "avg"
            else f"{NAMES.get(t, t)} {metric(t)}" for t in cols]
    ppl = "lambada" in summary["tasks"]
    lines = ["| model |" + (" LAMBADA ppl |" if ppl else "") + "".join(f" {h} |" for h in head),
             "|---|" + ("---|" if ppl else "") + "---|" * len(cols)]
    cell = "{:.1f} [{:.1f}, {:.1f}]".format
    for name, row in summary["rows"].items():
        lines.append(f"| {name} |" + (f" {row['lambada_ppl']:.2f} |" if ppl else "")
                     + "".join(f" {cell(*(100 * v for v in row[t]))} |" for t in cols))
    if summary["recovery"]:
        rec = summary["recovery"]
        lines.append("| Recovery (%) |" + (" - |" if ppl else "") + "".join(f" {cell(*(100 * v for v in rec[t]))} |" for t in cols))
    return lines


# ---------------------------------------------------------------------------------------------


def load_tasks(s, task_list):
    """{task: its questions}, --mc_limit of them evenly spaced, read once for every model."""
    tasks = {}
    for task in task_list:
        qs = subset(load_offline(task, s.mc_dir) if s.mc_source == "offline" else load_hub(task), s.mc_limit)
        if not qs:
            sys.exit(f"error: task {task} has no questions")
        tasks[task] = qs
    return tasks


def evaluate(net, tok, s, data, tasks, lm):
    """{'lm', task: ...} of net; lm: its held-out numbers (lm_metrics)."""
    res = {"lm": lm}
    for task, qs in tasks.items():
        if "continuation" in qs[0]:  # a cloze task: LAMBADA
            res[task] = cloze(net, tok, qs, s.batch_size, s.task_tokens)
            msg = f"acc {res[task]['acc']['score']:.3f}, ppl {res[task]['ppl']:.2f}"
        else:
            res[task] = mc_accuracy(net, tok, qs, s.batch_size, s.task_tokens)
            msg = f"acc {res[task]['acc']['score']:.3f}, acc_norm {res[task]['acc_norm']['score']:.3f}"
        print(f"  {task}: {msg} ({res[task]['n']} questions)", file=sys.stderr)
    return res


# the settings that decide a model's numbers; a --teacher_eval file must share them
SAME = ("data", "seq_len", "max_windows", "mc_source", "mc_dir", "mc_limit", "batch_size", "task_tokens", "device",
        "dtype")
SINCE = {"task_tokens": 0}  # a setting added later: what files written before it had


def teacher_of(d):
    """Who the teacher is in an --out file d: its reference (--teacher) when it measured one, else
    its model when that was a teacher (--init_from=teacher, or a file loaded as is; older files
    named the offline teacher --init_from=default), else None."""
    s = d["settings"]
    if "teacher" in d:
        return s["teacher"]
    if s.get("mixer") not in (None, "", "attention"):  # a new student, measured alone
        return None
    return s["teacher"] if s["init_from"] == "teacher" else s["init_from"]


def read_teacher_eval(s, task_list):
    """The teacher's results {'lm', task: ...} in s.teacher_eval, an earlier --out (of a student,
    under "teacher", or of the teacher itself, under "model"); ValueError unless they were
    measured with this run's teacher, settings and tasks."""
    path = s.teacher_eval
    try:
        with open(path) as f:
            d = json.load(f)
        saved, res, who = d["settings"], d.get("teacher", d["model"]), teacher_of(d)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"--teacher_eval={path}: not an evaluate.py --out file ({type(e).__name__}: {e})") from None
    if who != s.teacher:
        raise ValueError(f"--teacher_eval={path}: its teacher is {who!r}, this run's --teacher={s.teacher!r}")
    for key in SAME:
        was = saved.get(key, SINCE.get(key))
        if was != getattr(s, key):
            raise ValueError(f"--teacher_eval={path}: measured with --{key}={was}, this run has "
                             f"--{key}={getattr(s, key)}")
    if missing := [t for t in task_list if t not in res]:
        raise ValueError(f"--teacher_eval={path}: has no {', '.join(missing)}")
    return {k: res[k] for k in ["lm"] + task_list}


def main(argv=None):
    clock = cli.Clock()  # where the seconds go: the last line
    s, task_list = settings(argv)
    dtype = getattr(torch, s.dtype)
    missing = [t for t in task_list if s.mc_source == "offline" and not os.path.exists(os.path.join(s.mc_dir, f"{t}.jsonl"))]
    if missing:  # before any work: the perplexity pass takes minutes on a CPU
        sys.exit(f"error: {s.mc_dir} has no {', '.join(missing)}: run python data/mc_offline/prepare.py "
                 f"(offline tasks: {TASKS})")
    try:  # before the long work: the held-out file's shape, and where the report goes
        n = len(read_tokens(s.data))
        if n <= s.seq_len:
            raise ValueError(f"{s.data}: {n} tokens, fewer than one window of --seq_len={s.seq_len}")
        if s.out:
            checkpoint.check_writable(os.path.dirname(s.out), f"--out={s.out}")
        cached = read_teacher_eval(s, task_list) if s.teacher_eval else None
    except (FileNotFoundError, ValueError) as e:
        sys.exit(f"error: {e}")
    torch.manual_seed(0)  # an untrained student's new layers: the same draws every run
    net, tok = checkpoint.load_from_settings(s)
    try:
        student = net.config.mixer != "attention"
        teacher = None  # the reference of a student, unless --vs_teacher=false
        if student and s.vs_teacher:
            try:
                teacher = checkpoint.load(s.teacher, dtype=dtype, device=s.device).eval()
            except (FileNotFoundError, ValueError) as e:
                raise ValueError(f"--teacher={s.teacher}: {e}") from None
            checkpoint.check_teacher(teacher, s.teacher)
        if cached is not None and teacher is None:
            raise ValueError(f"--teacher_eval={s.teacher_eval}: needs a student and a teacher to compare it with")
        data = read_tokens(s.data, net.config.vocab_size)
    except (FileNotFoundError, ValueError) as e:
        sys.exit(f"error: {e}")
    label = checkpoint.label(s)
    print(f"evaluating {label} ({net.config.mixer})", file=sys.stderr)
    tasks = load_tasks(s, task_list)
    clock.mark("startup")  # settings, the models, the held-out text and the tasks
    # the held-out pass first, the teacher's too (for the KL): it checks a --teacher_eval file
    lm = lm_metrics(net, data, s.seq_len, s.max_windows, s.batch_size, teacher)
    if cached is not None and not math.isclose(lm["teacher_loss"], cached["lm"]["loss"], rel_tol=1e-4):
        sys.exit(f"error: --teacher_eval={s.teacher_eval}: the teacher's held-out loss there is "
                 f"{cached['lm']['loss']:.6f}, here {lm['teacher_loss']:.6f}: another teacher or other code; "
                 f"evaluate the teacher again (drop --teacher_eval)")
    clock.mark("held-out text")
    results = {"model": evaluate(net, tok, s, data, tasks, lm)}
    if cached is not None:
        print(f"the teacher {s.teacher}: task scores from {s.teacher_eval}", file=sys.stderr)
        results["teacher"] = cached
    elif teacher is not None:  # its held-out numbers come from the pass above
        print(f"evaluating the teacher {s.teacher}", file=sys.stderr)
        t_lm = {"tokens": lm["tokens"], "loss": lm["teacher_loss"], "ppl": float(np.exp(lm["teacher_loss"]))}
        results["teacher"] = evaluate(teacher, tok, s, data, tasks, t_lm)
    clock.mark("tasks")
    print(f"\nheld-out {lm['tokens']:,} tokens: loss {lm['loss']:.4f}, ppl {lm['ppl']:.2f}"
          + (f", KL to teacher {lm['kl']:.4f} nats/token (teacher ppl {results['teacher']['lm']['ppl']:.2f})" if teacher else ""))
    if task_list:
        runs = [results["teacher"], results["model"]] if teacher else [results["model"]]
        names = ["teacher", f"student ({label})"] if teacher else [f"teacher ({label})" if not student else label]
        results["summary"] = summarize(runs, names)
        print("\n" + "\n".join(markdown(results["summary"])))
        print("\nquestions per task: " + ", ".join(f"{t} {results['model'][t]['n']}" for t in task_list)
              + "; in %, [95% interval]: Wilson for a task, bootstrap for Avg, paired bootstrap for Recovery")
    if s.out:
        with open(s.out, "w") as f:
            json.dump({"settings": {**asdict(s), "task_list": task_list}, **results}, f, indent=1)
    clock.mark("writing")
    print(clock.line())
    return results


if __name__ == "__main__":
    main()
