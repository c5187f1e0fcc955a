"""
Language-modelling evaluation of the teacher or a student: perplexity and KL to the teacher
on held-out text, zero-shot multiple-choice accuracy, and teacher recovery.

    python evaluate.py                                         # the offline teacher
    python evaluate.py --init_from=out/gated_deltanet/stage3.pt    # a student, against the teacher
    python evaluate.py --mixer=gla --mc_limit=50               # an untrained student (smoke test)
    python evaluate.py --mc_source=hub --mc_limit=0            # the study's tasks from the hub, all

Perplexity: exp of the mean next-token cross-entropy over windows of --seq_len tokens of
--data (default data/offline/val.bin). KL: mean over predicted positions of
KL(teacher || student) = sum_v p_teacher(v) (log p_teacher(v) - log p_student(v)), in nats.
Multiple choice: every answer choice is a (context, continuation) pair, scored by the sum of
log p(continuation tokens | context). `acc` picks the highest sum; `acc_norm` the highest sum
per UTF-8 byte of the continuation text (lm-evaluation-harness's acc_norm), which removes the
bias towards short answers. LAMBADA (hub only) counts a hit when greedy decoding reproduces the
last word. Recovery = student score / teacher score, per task (the study's measure).
Offline tasks come from data/mc_offline/ (python data/mc_offline/prepare.py).

References: What Matters in Linearizing Language Models? arXiv 2504.14366 (tasks, recovery);
EleutherAI lm-evaluation-harness (acc, acc_norm, LAMBADA); AI2's OLMo in-loop evaluation (data).
"""

import argparse
import json
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

import checkpoint

ROOT = os.path.dirname(os.path.abspath(__file__))
TASKS = "arc_easy,arc_challenge,piqa,hellaswag,winogrande"  # + lambada with --mc_source=hub


def get_args(argv=None):
    cuda = torch.cuda.is_available()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    checkpoint.add_args(p)  # the model to evaluate: --init_from, --tokenizer, --mixer, --device, --dtype, --backend
    p.add_argument("--teacher", default="default", help="reference for KL and recovery when the model is a student; 'none' skips")
    p.add_argument("--data", default=os.path.join(ROOT, "data", "offline", "val.bin"), help="uint16 token file")
    p.add_argument("--seq_len", type=int, default=512, help="window length for perplexity (the study trains at 512)")
    p.add_argument("--max_windows", type=int, default=256 if cuda else 16, help="windows of --data, evenly spaced")
    p.add_argument("--tasks", default=TASKS, help="comma-separated; empty for none")
    p.add_argument("--mc_source", default="offline", choices=["offline", "hub"], help="data/mc_offline/ or `datasets`")
    p.add_argument("--mc_dir", default=os.path.join(ROOT, "data", "mc_offline"), help="offline task files")
    p.add_argument("--mc_limit", type=int, default=0 if cuda else 50, help="questions per task (0 = all)")
    p.add_argument("--batch_size", type=int, default=32 if cuda else 4)
    p.add_argument("--out", default=None, help="write the results here as JSON")
    return p.parse_args(argv)


# ---------------------------------------------------------------------------------------------
# Perplexity and KL on held-out tokens


@torch.no_grad()
def lm_metrics(net, data, seq_len, max_windows, batch_size=4, teacher=None):
    """{'tokens', 'loss', 'ppl'[, 'kl']} over up to max_windows evenly spaced windows of data."""
    n = min(max_windows, (len(data) - 1) // seq_len)
    starts = np.linspace(0, len(data) - seq_len - 1, n).astype(np.int64)
    device = next(net.parameters()).device
    nll = kl = 0.0
    for b in range(0, n, batch_size):
        x = torch.stack([torch.from_numpy(np.asarray(data[s:s + seq_len + 1], dtype=np.int64)) for s in starts[b:b + batch_size]])
        x = x.to(device)  # (B, T + 1): inputs x[:, :-1], targets x[:, 1:]
        logp = F.log_softmax(net(x[:, :-1]).float(), -1)  # (B, T, V)
        nll -= logp.gather(-1, x[:, 1:, None]).sum().item()
        if teacher is not None:
            logq = F.log_softmax(teacher(x[:, :-1]).float(), -1)  # teacher's log probabilities
            kl += (logq.exp() * (logq - logp)).sum().item()  # summed over vocabulary and positions
    tokens = n * seq_len
    out = {"tokens": tokens, "loss": nll / tokens, "ppl": float(np.exp(nll / tokens))}
    if teacher is not None:
        out["kl"] = kl / tokens  # per token (the study's code summed over positions: see distill.kl_per_token)
    return out


# ---------------------------------------------------------------------------------------------
# Multiple choice


@torch.no_grad()
def loglikelihoods(net, tok, requests, batch_size=4, max_len=2048):
    """[(context, continuation)] -> [(sum log p(continuation | context), greedy)], where greedy
    says whether argmax decoding would have produced the continuation exactly."""
    device = next(net.parameters()).device
    enc = []
    for ctx, cont in requests:
        c, x = tok.encode(ctx) or [tok.eot_id], tok.encode(cont)  # an empty context starts at <|endoftext|>
        enc.append(((c + x)[-max_len - 1:], len(x)))
    order = sorted(range(len(enc)), key=lambda i: -len(enc[i][0]))  # similar lengths share a batch
    out = [None] * len(enc)
    for b in range(0, len(order), batch_size):
        idx = order[b:b + batch_size]
        T = max(len(enc[i][0]) for i in idx) - 1
        x = torch.zeros(len(idx), T + 1, dtype=torch.long)
        for r, i in enumerate(idx):  # right padding: a causal model never looks at it
            x[r, :len(enc[i][0])] = torch.tensor(enc[i][0])
        x = x.to(device)
        logp = F.log_softmax(net(x[:, :-1]).float(), -1)  # (B, T, V)
        for r, i in enumerate(idx):
            ids, n = enc[i]
            pos = torch.arange(len(ids) - 1 - n, len(ids) - 1, device=device)  # positions predicting the continuation
            target = x[r, pos + 1]
            lp = logp[r, pos].gather(-1, target[:, None]).sum().item()
            out[i] = (lp, bool((logp[r, pos].argmax(-1) == target).all()))
    return out


def mc_accuracy(net, tok, questions, batch_size=4):
    """{'acc', 'acc_norm', 'n'} for questions [{'requests': [(context, continuation)], 'gold'}]."""
    flat = [tuple(r) for q in questions for r in q["requests"]]
    scores = iter(loglikelihoods(net, tok, flat, batch_size))
    acc = acc_norm = greedy = 0
    for q in questions:
        got = [next(scores) for _ in q["requests"]]
        lp = [s for s, _ in got]
        per_byte = [s / max(1, len(cont.encode("utf-8"))) for s, (_, cont) in zip(lp, q["requests"])]
        acc += int(np.argmax(lp)) == q["gold"]
        acc_norm += int(np.argmax(per_byte)) == q["gold"]
        greedy += got[q["gold"]][1]
    n = len(questions)
    if all(len(q["requests"]) == 1 for q in questions):  # LAMBADA: one continuation, greedy hit
        return {"acc": greedy / n, "acc_norm": greedy / n, "n": n}
    return {"acc": acc / n, "acc_norm": acc_norm / n, "n": n}


def load_offline(task, folder):
    path = os.path.join(folder, f"{task}.jsonl")
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} missing: run python data/mc_offline/prepare.py (offline tasks: {TASKS})")
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def _hellaswag_clean(text):  # the harness's preprocessing of WikiHow artefacts
    import re

    return re.sub(r"\[.*?\]", "", text.strip().replace(" [title]", ". ")).replace("  ", " ")


def load_hub(task):
    """The study's tasks through `datasets` (needs the hub), in the offline format."""
    from datasets import load_dataset

    q = []
    if task in ("arc_easy", "arc_challenge"):
        for d in load_dataset("allenai/ai2_arc", "ARC-Easy" if task == "arc_easy" else "ARC-Challenge", split="test"):
            ctx = f"Question: {d['question']}\nAnswer:"
            q.append({"requests": [(ctx, " " + c) for c in d["choices"]["text"]], "gold": d["choices"]["label"].index(d["answerKey"])})
    elif task == "piqa":  # a script-free copy of ybisk/piqa, as the harness uses
        for d in load_dataset("baber/piqa", split="validation"):
            ctx = f"Question: {d['goal']}\nAnswer:"
            q.append({"requests": [(ctx, " " + d["sol1"]), (ctx, " " + d["sol2"])], "gold": int(d["label"])})
    elif task == "hellaswag":
        for d in load_dataset("Rowan/hellaswag", split="validation"):
            ctx = _hellaswag_clean(d["activity_label"] + ": " + d["ctx_a"] + " " + d["ctx_b"].capitalize())
            q.append({"requests": [(ctx, " " + _hellaswag_clean(e)) for e in d["endings"]], "gold": int(d["label"])})
    elif task == "winogrande":  # partial scoring: each option in the context, the rest scored
        for d in load_dataset("allenai/winogrande", "winogrande_xl", split="validation"):
            i = d["sentence"].index("_")
            rest = " " + d["sentence"][i + 1:].strip()
            q.append({"requests": [(d["sentence"][:i] + d[o], rest) for o in ("option1", "option2")], "gold": int(d["answer"]) - 1})
    elif task == "lambada":
        for d in load_dataset("EleutherAI/lambada_openai", "default", split="test"):
            ctx, word = d["text"].rsplit(" ", 1)
            q.append({"requests": [(ctx, " " + word)], "gold": 0})
    else:
        raise ValueError(f"unknown task {task!r}; known: {TASKS},lambada")
    return q


# ---------------------------------------------------------------------------------------------


def evaluate(net, tok, args, data, teacher=None):
    res = {"lm": lm_metrics(net, data, args.seq_len, args.max_windows, args.batch_size, teacher)}
    for task in filter(None, args.tasks.split(",")):
        qs = load_offline(task, args.mc_dir) if args.mc_source == "offline" else load_hub(task)
        qs = qs[:args.mc_limit] if args.mc_limit else qs  # the files' own order: a fixed subset
        res[task] = mc_accuracy(net, tok, qs, args.batch_size)
        print(f"  {task}: acc {res[task]['acc']:.3f}, acc_norm {res[task]['acc_norm']:.3f} ({res[task]['n']} questions)", file=sys.stderr)
    return res


def main(argv=None):
    args = get_args(argv)
    dtype = getattr(torch, args.dtype)
    tasks = [t for t in args.tasks.split(",") if t]
    missing = [t for t in tasks if args.mc_source == "offline" and not os.path.exists(os.path.join(args.mc_dir, f"{t}.jsonl"))]
    if missing:  # before any work: the perplexity pass takes minutes on a CPU
        sys.exit(f"error: {args.mc_dir} has no {', '.join(missing)}: run python data/mc_offline/prepare.py "
                 f"(offline tasks: {TASKS})")
    net, tok = checkpoint.load_from_args(args)
    try:
        student = net.config.mixer != "attention"
        teacher = checkpoint.load(args.teacher, dtype=dtype, device=args.device).eval() if student and args.teacher != "none" else None
        data = np.memmap(args.data, dtype=np.uint16, mode="r")
    except (FileNotFoundError, ValueError) as e:
        sys.exit(f"error: {e}")
    print(f"evaluating {args.mixer or args.init_from} ({net.config.mixer})", file=sys.stderr)
    results = {"model": evaluate(net, tok, args, data, teacher)}
    if teacher is not None:
        print(f"evaluating the teacher {args.teacher}", file=sys.stderr)
        results["teacher"] = evaluate(teacher, tok, args, data)
    lm = results["model"]["lm"]
    print(f"\nheld-out {lm['tokens']:,} tokens: loss {lm['loss']:.4f}, ppl {lm['ppl']:.2f}"
          + (f", KL to teacher {lm['kl']:.4f} nats/token (teacher ppl {results['teacher']['lm']['ppl']:.2f})" if teacher else ""))
    tasks = [t for t in results["model"] if t != "lm"]
    if tasks:
        print("\n| task | n | acc | acc_norm |" + (" teacher acc_norm | recovery |" if teacher else ""))
        print("|---|---|---|---|" + ("---|---|" if teacher else ""))
    for t in tasks:
        m = results["model"][t]
        row = f"| {t} | {m['n']} | {100 * m['acc']:.1f} | {100 * m['acc_norm']:.1f} |"
        if teacher:
            ref = results["teacher"][t]["acc_norm"]
            m["recovery"] = m["acc_norm"] / ref if ref > 0 else float("nan")
            row += f" {100 * ref:.1f} | {100 * m['recovery']:.1f}% |"
        print(row)
    if teacher and tasks:
        print(f"mean recovery (acc_norm): {100 * np.mean([results['model'][t]['recovery'] for t in tasks]):.1f}%")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"settings": vars(args), **results}, f, indent=1)
    return results


if __name__ == "__main__":
    main()
