"""
Needle in a haystack: can the model find one fact hidden in a long text?

    python niah.py                                      # offline teacher, CPU quick setting
    python niah.py --init_from=out/gated_deltanet/stage3.pt --full     # GPU setting, up to 8k
    python niah.py --mixer=gla --lengths=512,1024       # untrained student (smoke test)

A prompt of exactly `length` tokens holds filler text with one needle sentence at a chosen
depth (0% = first sentence, 100% = last), then a question; the model answers greedily and the
first word of its answer must equal the needle's value after normalization. Three needles, as
in RULER's single-needle tasks: `passkey` (a 5-digit pass key), `kv` (a word key, a 7-digit
value) and `uuid` (a word key, a UUID value). Prompts of one length run as a batch: a teacher
prefills its KV cache, a student reads the haystack with the chunked form and answers from its
recurrent state. Output: a table per length and depth, and results.json, results.csv and
heatmap.png in --out_dir.

The filler is held-out text (data/offline/val.bin, a different window per prompt, so no
repeats) or RULER's repeated "The grass is green..." noise (--filler=grass).

References:
1) Hsieh et al. 2024, RULER: What's the Real Context Size of Your Long-Context Language Models?
   (niah_single tasks, their templates and the noise filler)
2) Mohtashami & Jaggi 2023, Landmark Attention (the pass-key task)
3) What Matters in Linearizing Language Models? arXiv 2504.14366 (passkey accuracy by length)
"""

import argparse
import csv
import json
import os
import random
import sys
import time
import uuid

import numpy as np
import torch

import checkpoint

GRASS = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
WORDS = ("apple ocean violin marble garden rocket silver thunder lantern meadow puzzle harbor "
         "falcon candle pepper glacier compass velvet orchard summit crystal jungle anchor bamboo "
         "cobalt dragon ember feather goblet hammock island jasmine kettle lemon mirror nectar "
         "oyster pebble quartz ribbon saddle tulip walnut zephyr").split()
# needle sentence, question, answer prefix (RULER's niah_single templates; passkey as in Landmark)
NEEDLES = {
    "passkey": (" The pass key is {value}. Remember it. {value} is the pass key.",
                "What is the pass key?", "The pass key is"),
    "kv": (" One of the special magic numbers for {key} is: {value}.",
           "What is the special magic number for {key} mentioned in the provided text?",
           "The special magic number for {key} mentioned in the provided text is"),
    "uuid": (" One of the special magic uuids for {key} is: {value}.",
             "What is the special magic uuid for {key} mentioned in the provided text?",
             "The special magic uuid for {key} mentioned in the provided text is"),
}
INSTRUCTION = ("Some special magic {what} are hidden within the following text. Make sure to memorize "
               "it. I will quiz you about the {what} afterwards.\n")


def get_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    checkpoint.add_args(p)  # --init_from, --tokenizer, --mixer, --device, --dtype
    p.add_argument("--full", action="store_true", help="GPU setting: lengths up to 8k, 30 prompts per cell")
    p.add_argument("--lengths", default=None, help="prompt lengths in tokens (default 512,1024,2048; --full adds 4096,8192)")
    p.add_argument("--depths", default="0,25,50,75,100", help="needle depths in percent of the haystack")
    p.add_argument("--kinds", default="passkey,kv,uuid", help="needles, assigned to prompts in turn")
    p.add_argument("--samples", type=int, default=None, help="prompts per (length, depth) cell (default 1; --full 30)")
    p.add_argument("--filler", default="offline", choices=["offline", "grass"], help="held-out text or RULER's noise")
    p.add_argument("--data", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "offline", "val.bin"))
    p.add_argument("--plain", action="store_true", help="plain completion prompt instead of ChatML (base models)")
    p.add_argument("--batch_size", type=int, default=None, help="prompts per forward (default 4 on CPU, 16 on GPU)")
    p.add_argument("--out_dir", default=None, help="where results go (default out/niah/<model name>)")
    p.add_argument("--seed", type=int, default=1337)
    a = p.parse_args(argv)
    try:
        default = "512,1024,2048,4096,8192" if a.full else "512,1024,2048"
        a.lengths = [int(x) for x in (a.lengths or default).split(",")]
        a.depths = [float(x) for x in a.depths.split(",")]
    except ValueError as e:
        p.error(f"--lengths and --depths are comma-separated numbers: {e}")
    a.kinds = a.kinds.split(",")
    a.samples = a.samples or (30 if a.full else 1)
    a.batch_size = a.batch_size or (16 if a.device.startswith("cuda") else 4)
    if set(a.kinds) - set(NEEDLES) or not all(0 <= d <= 100 for d in a.depths) or min(a.lengths) < 128:
        p.error(f"kinds must be among {list(NEEDLES)}, depths in 0..100, lengths >= 128")
    return a


# ---------------------------------------------------------------------------------------------
# Building prompts: token ids, so that every prompt has exactly the requested length


def make_needle(kind, rng):
    """(kind, key, value) with a random key word and value."""
    key = rng.choice(WORDS)
    if kind == "passkey":
        value = str(rng.randint(10000, 99999))
    elif kind == "kv":
        value = str(rng.randint(1000000, 9999999))
    else:
        value = str(uuid.UUID(int=rng.getrandbits(128), version=4))
    return kind, key, value


class Haystack:
    """Filler token ids of any length, and where sentences end in them (needles go there)."""

    def __init__(self, tok, filler="offline", data=None):
        if filler == "offline" and data and os.path.exists(data):
            ids = np.memmap(data, dtype=np.uint16, mode="r")
            self.ids = np.asarray(ids[ids != tok.eot_id], dtype=np.int64)  # documents run together
        else:
            if filler == "offline":
                print(f"{data} not found (python data/offline/prepare.py); using the grass filler", file=sys.stderr)
            self.ids = np.asarray(tok.encode(GRASS * 200), dtype=np.int64)
        # ends[id]: the token's text ends a sentence or a line, so a needle may follow it
        texts = [tok.decode([i]) for i in range(tok.n_vocab)]
        self.ends = np.array([t.rstrip(" ").endswith((".", "!", "?", "\n")) for t in texts])

    def sample(self, n, rng):
        """n filler ids from a random window that ends at a sentence end (the offline text is
        long enough not to repeat; the grass filler repeats itself to any length)."""
        reps = -(-2 * n // len(self.ids)) + 1
        ids = np.tile(self.ids, reps) if reps > 1 else self.ids
        stops = np.nonzero(self.ends[ids[n - 1:]])[0] + n  # window ends e >= n after an end token
        stop = int(stops[rng.randrange(len(stops))]) if len(stops) else len(ids)
        return ids[stop - n:stop]

    def insert_at(self, hay, depth):
        """Index in hay where the needle goes: the sentence end nearest to depth% of it."""
        target = round(depth / 100 * len(hay))
        cands = np.concatenate([[0], np.nonzero(self.ends[hay[:-1]])[0] + 1, [len(hay)]])  # after an end
        return int(cands[np.abs(cands - target).argmin()])


def build_prompt(tok, hay, needle, length, depth, rng, chat=True):
    """Prompt ids of exactly `length` tokens, the needle's position in them, and the answer."""
    kind, key, value = needle
    text, question, prefix = (s.format(key=key, value=value) for s in NEEDLES[kind])
    what = {"passkey": "pass key", "kv": "numbers", "uuid": "uuids"}[kind]
    head, tail = INSTRUCTION.format(what=what), "\n" + question
    if chat:  # ChatML; the answer prefix opens the assistant's reply, as RULER does
        ids, _ = tok.encode_chat([{"role": "user", "content": ""}], add_generation_prompt=True)
        j = len(ids) - 1 - ids[::-1].index(tok.im_end_id)  # the <|im_end|> closing the user turn
        pre, post = ids[:j] + tok.encode(head), tok.encode(tail) + ids[j:] + tok.encode(prefix)
    else:
        pre, post = tok.encode(head), tok.encode(tail + "\n" + prefix)
    needle_ids = tok.encode(text)
    n_hay = length - len(pre) - len(post) - len(needle_ids)
    if n_hay < 1:
        raise ValueError(f"length {length} is too short for the prompt template ({length - n_hay} tokens)")
    filler = hay.sample(n_hay, rng)
    at = hay.insert_at(filler, depth)
    ids = pre + filler[:at].tolist() + needle_ids + filler[at:].tolist() + post
    return ids, len(pre) + at, value


def normalize(text):
    """The first word of an answer, without case, markup or surrounding punctuation."""
    for word in text.strip().split():
        word = word.strip(".,;:!?\"'`*()[]{}<>").lower()
        if word:
            return word
    return ""


def exact_match(prediction, value):
    return normalize(prediction) == normalize(value)


# ---------------------------------------------------------------------------------------------
# Answering: one batched prefill, then greedy steps from the caches


@torch.no_grad()
def greedy(net, idx, max_new_tokens):
    """Greedy continuation ids [B, max_new_tokens] of prompts idx [B, T]: the prompt goes through
    once (teacher: KV cache; student: chunked form into its state), then one token per step."""
    return torch.stack(list(net.generate(idx, max_new_tokens, temperature=0)), 1)


def model_answerer(net, tok, device):
    """prompts (list of equal-length id lists), max_new -> answer strings, cut at end of turn."""
    stops = {tok.im_end_id, tok.eot_id}

    def answer(prompts, max_new):
        idx = torch.tensor(prompts, dtype=torch.long, device=device)  # (B, T)
        texts = []
        for row in greedy(net, idx, max_new).tolist():
            cut = next((i for i, t in enumerate(row) if t in stops), len(row))
            texts.append(tok.decode(row[:cut]))
        return texts

    return answer


def run(answer, tok, hay, lengths, depths, kinds, samples, batch_size=4, chat=True, seed=1337, log=sys.stderr):
    """Every (length, depth, sample) prompt through answer(); a list of result dicts."""
    rng, records, t0 = random.Random(seed), [], time.time()
    total, done = len(lengths) * len(depths) * samples, 0
    # the ETA counts prompt tokens, not prompts: a 4k prompt costs 8 times a 512 one (or more)
    work, work_done = sum(lengths) * len(depths) * samples, 0
    for length in lengths:
        cells = [(d, s) for d in depths for s in range(samples)]
        jobs = []
        for i, (depth, s) in enumerate(cells):  # needle kinds in turn, so any count covers them all
            needle = make_needle(kinds[(len(records) + i) % len(kinds)], rng)
            ids, pos, value = build_prompt(tok, hay, needle, length, depth, rng, chat)
            jobs.append(dict(length=length, depth=depth, kind=needle[0], value=value, needle_pos=pos, ids=ids))
        for b in range(0, len(jobs), batch_size):
            batch = jobs[b:b + batch_size]
            max_new = max(len(tok.encode(" " + j["value"])) for j in batch) + 3  # room for markup
            for j, pred in zip(batch, answer([j["ids"] for j in batch], max_new)):
                j.pop("ids")
                records.append(dict(j, prediction=pred, correct=exact_match(pred, j["value"])))
            done, work_done = done + len(batch), work_done + length * len(batch)
            rate = (time.time() - t0) / work_done
            print(f"\rniah: {done}/{total} prompts, length {length}, {time.time() - t0:.0f}s, "
                  f"~{rate * (work - work_done):.0f}s left", end="", file=log, flush=True)
    print(file=log)
    return records


# ---------------------------------------------------------------------------------------------
# Reporting


def summarize(records):
    """{(length, depth or 'all', kind or 'all'): accuracy}."""
    groups = {}
    for r in records:
        for d in (r["depth"], "all"):
            for k in (r["kind"], "all"):
                groups.setdefault((r["length"], d, k), []).append(r["correct"])
    return {key: sum(v) / len(v) for key, v in groups.items()}


def table(acc, lengths, depths, kinds):
    """Accuracy (%) with depths as rows and lengths as columns, then one row per needle kind."""
    rows = [f"| depth \\ length | " + " | ".join(str(n) for n in lengths) + " |", "|---" * (len(lengths) + 1) + "|"]
    for d in list(depths) + ["all"]:
        label = "all depths" if d == "all" else f"{d:g}%"
        rows.append(f"| {label} | " + " | ".join(f"{100 * acc[(n, d, 'all')]:.1f}" for n in lengths) + " |")
    for k in kinds:
        rows.append(f"| {k} | " + " | ".join(f"{100 * acc[(n, 'all', k)]:.1f}" if (n, "all", k) in acc else "-" for n in lengths) + " |")
    return "\n".join(rows)


def heatmap(acc, lengths, depths, path, title):
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    grid = np.array([[100 * acc[(n, d, "all")] for n in lengths] for d in depths])  # (depths, lengths)
    fig, ax = plt.subplots(figsize=(1.2 * len(lengths) + 2.5, 0.6 * len(depths) + 1.8))
    im = ax.imshow(grid, cmap="RdYlGn", vmin=0, vmax=100, aspect="auto")
    for (i, j), v in np.ndenumerate(grid):
        ax.text(j, i, f"{v:.0f}", ha="center", va="center", fontsize=9)
    ax.set_xticks(range(len(lengths)), [str(n) for n in lengths])
    ax.set_yticks(range(len(depths)), [f"{d:g}%" for d in depths])
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("needle depth")
    ax.set_title(title, fontsize=10)
    fig.colorbar(im, ax=ax, label="exact match (%)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None):
    args = get_args(argv)
    torch.manual_seed(args.seed)
    net, tok = checkpoint.load_from_args(args)
    name = args.mixer or os.path.splitext(os.path.basename(args.init_from.rstrip("/")))[0]
    out_dir = args.out_dir or os.path.join("out", "niah", name)
    hay = Haystack(tok, args.filler, args.data)
    print(f"{net.config.mixer} model ({name}), lengths {args.lengths}, depths {args.depths}, "
          f"{args.samples} prompt(s) per cell, {args.device} {args.dtype}", file=sys.stderr)
    t0 = time.time()
    records = run(model_answerer(net, tok, args.device), tok, hay, args.lengths, args.depths, args.kinds,
                  args.samples, args.batch_size, not args.plain, args.seed)
    seconds = time.time() - t0
    acc = summarize(records)
    print(f"\nneedle-in-a-haystack exact match (%), {name}, {len(records)} prompts in {seconds:.0f}s\n")
    print(table(acc, args.lengths, args.depths, args.kinds))
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump({"settings": vars(args), "seconds": seconds, "records": records}, f, indent=1)
    with open(os.path.join(out_dir, "results.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["length", "depth", "kind", "accuracy"])
        for (n, d, k), a in sorted(acc.items(), key=str):
            w.writerow([n, d, k, f"{a:.4f}"])
    heatmap(acc, args.lengths, args.depths, os.path.join(out_dir, "heatmap.png"), f"needle in a haystack: {name}")
    print(f"\nwrote {out_dir}/results.json, results.csv, heatmap.png")
    return acc


if __name__ == "__main__":
    main()
