"""
Needle in a haystack, RULER's single-needle tasks: can the model find one fact hidden in a long
text?

    python niah.py                                  # offline teacher, the three tasks, CPU setting
    python niah.py --tasks=s_niah_1 --lengths=512   # the study's passkey alone (needs no corpus)
    python niah.py --init_from=out/gated_deltanet/stage3.pt --full     # GPU setting, up to 8k
    python niah.py --mixer=gla --lengths=512,1024   # untrained student of the teacher (smoke test)

The model is --teacher (--init_from=teacher, the default), a new student of it (--mixer), or a
checkpoint (--init_from=<checkpoint>), as in sample.py and evaluate.py.

The tasks are RULER's niah_single_1..3 (scripts/synthetic.yaml). The needle is "One of the
special magic numbers for {key} is: {value}." with an adjective-noun key, as in RULER:
    s_niah_1  noise haystack ("The grass is green. ... There and back again." line after line),
              a 7-digit value. This is the passkey task the study reports by length.
    s_niah_2  essay haystack, a 7-digit value
    s_niah_3  essay haystack, a UUID value ("special magic uuids")
RULER's essays are Paul Graham's; ours are held-out modern English text, data/modern/val.bin
(python data/modern/prepare.py) or any file of that format given with --data, with every run of
whitespace made one space, as RULER does with the essays.

A prompt of exactly `length` tokens is RULER's template in its single-needle wording: the
instruction, the haystack with the needle at a chosen depth (0% = start, 100% = end: the nearest
line break of the noise, the nearest sentence end of an essay; RULER draws the depth at random,
we sweep it), the question, and the answer prefix, which opens the model's reply. The model
answers greedily and is scored with RULER's niah metric, string match: an answer is right when
it contains the value (case ignored). Prompts of one length run as a batch: a teacher prefills
its KV cache, a student reads the haystack with the chunked form and answers from its recurrent
state. Output: a table per task (depth by length), and in --out_dir results.json (settings,
accuracy per cell, every prompt's prediction beside its value), results.csv (one row a prompt)
and heatmap.png.

References:
1) Hsieh et al. 2024, RULER: What's the Real Context Size of Your Long-Context Language Models?
   github.com/NVIDIA/RULER: scripts/synthetic.yaml (the tasks), scripts/data/synthetic/niah.py
   and constants.py (needle, noise, template), scripts/eval/synthetic/constants.py (string match)
2) What Matters in Linearizing Language Models? arXiv 2504.14366 (passkey accuracy by length)
"""

import csv
import functools
import json
import os
import random
import sys
import time
import uuid
from dataclasses import asdict, dataclass

import numpy as np
import torch

import checkpoint
import cli
import decode
import plots
from data import read_tokens

NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
# task: (haystack, value type, title); the value type names the needle in RULER's templates
TASKS = {
    "s_niah_1": ("noise", "number",
                 "S-NIAH-1: noise haystack, 7-digit value (the study's passkey)"),
    "s_niah_2": ("essay", "number", "S-NIAH-2: essay haystack, 7-digit value"),
    "s_niah_3": ("essay", "uuid", "S-NIAH-3: essay haystack, UUID value"),
}
# RULER's single-needle wording: its template with "Some" -> "A", "are" -> "is", singular type
NEEDLE = "One of the special magic {v}s for {key} is: {value}."
INSTRUCTION = ("A special magic {v} is hidden within the following text. Make sure to memorize it. "
               "I will quiz you about the {v} afterwards.\n")
QUESTION = "\nWhat is the special magic {v} for {key} mentioned in the provided text?"
ANSWER_PREFIX = " The special magic {v} for {key} mentioned in the provided text is"
# keys: RULER pairs wonderwords' adjectives and nouns; a few of each do here
ADJECTIVES = ("ancient brave calm damp eager fancy gentle hollow icy jolly keen lucky misty noble "
              "odd proud quiet rapid shy tidy vast wild young zesty").split()
NOUNS = ("apple ocean violin marble garden rocket silver thunder lantern meadow puzzle harbor "
         "falcon candle pepper glacier compass velvet orchard summit crystal jungle anchor bamboo "
         "cobalt dragon ember feather goblet hammock island jasmine kettle lemon mirror nectar "
         "oyster pebble quartz ribbon saddle tulip walnut zephyr").split()
DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "modern", "val.bin")
PREPARE = "python data/modern/prepare.py"


@dataclass
class Settings(checkpoint.ModelSettings):  # the model's settings first: --init_from, --mixer, ...
    # --- the prompts ---
    full: bool = False  # GPU setting: --lengths up to 8192 and --samples=30, unless given
    tasks: str = ",".join(TASKS)  # comma-separated, among s_niah_1, s_niah_2, s_niah_3
    lengths: str = "512,1024,2048"  # prompt lengths in tokens (--full: to 8192)
    depths: str = "0,25,50,75,100"  # needle depths in percent of the haystack
    samples: int = 1  # prompts per (task, length, depth) cell (--full: 30)
    data: str = DATA  # held-out text for the essay haystacks (uint16 tokens, documents ended by
    #   0; python data/modern/prepare.py)
    plain: bool = False  # plain completion prompt instead of ChatML (base models)
    # --- the run ---
    batch_size: int = 4  # prompts per forward (on a GPU: 50, the prompts of one task and length at
    #   reproduce.py's 10 samples, so a batch is never a remainder)
    out_dir: str = ""  # where results go; "" = out/niah/<model name>
    seed: int = 1337  # needles, haystack windows, and an untrained student's new weights
    decoder: str = "auto"  # fast: static caches (decode.py), on CUDA compiled and replayed from a
    #   CUDA graph; plain: decode.plain's growing caches; auto: fast on CUDA, plain otherwise


GPU_DEFAULTS = {**checkpoint.GPU_DEFAULTS, "batch_size": 50}
FULL = dict(lengths="512,1024,2048,4096,8192", samples=30)  # --full, unless given


def fail(msg):
    """A setting that cannot work: one line on stderr and status 2, before any model loads."""
    print(f"niah.py: error: {msg}", file=sys.stderr)
    raise SystemExit(2)


def numbers(s, key, kind):
    """A comma-separated setting as a list of kind, or fail's one line."""
    try:
        return [kind(x) for x in getattr(s, key).split(",")]
    except ValueError as e:
        fail(f"--lengths and --depths are comma-separated numbers: --{key}: {e}")


def settings(argv=None):
    """The run's Settings from the command line (--help lists them), checked, and its tasks,
    lengths and depths as lists."""
    s, given = cli.settings(sys.argv[1:] if argv is None else argv, Settings, fail, GPU_DEFAULTS)
    if s.full:
        for key, value in FULL.items():
            setattr(s, key, given.get(key, value))
    checkpoint.check_settings(s, fail)
    lengths, depths = numbers(s, "lengths", int), numbers(s, "depths", float)
    tasks = s.tasks.split(",")
    if s.samples < 1 or s.batch_size < 1:
        fail(f"--samples={s.samples} and --batch_size={s.batch_size}: expected integers >= 1")
    if set(tasks) - set(TASKS) or not all(0 <= d <= 100 for d in depths) or min(lengths) < 128:
        fail(f"--tasks must be among {', '.join(TASKS)}, depths in 0..100, lengths >= 128")
    if s.decoder not in decode.DECODERS:
        fail(f"--decoder={s.decoder!r}: expected one of {', '.join(decode.DECODERS)}")
    return s, tasks, lengths, depths


# ---------------------------------------------------------------------------------------------
# Building prompts: token ids, so that every prompt has exactly the requested length


def make_needle(task, rng):
    """(key, value): an adjective-noun key and a 7-digit number or a UUID, as RULER draws them."""
    key = f"{rng.choice(ADJECTIVES)}-{rng.choice(NOUNS)}"
    if TASKS[task][1] == "number":
        return key, str(rng.randint(10 ** 6, 10 ** 7 - 1))
    return key, str(uuid.UUID(int=rng.getrandbits(128), version=4))


@functools.lru_cache(maxsize=2)
def sentence_ends(tok):
    """ends[id]: the token's text ends a sentence or a line (one pass over the vocabulary, shared
    by every haystack of this tokenizer)."""
    texts = [tok.decode([i]) for i in range(tok.n_vocab)]
    return np.array([t.rstrip(" ").endswith((".", "!", "?", "\n")) for t in texts])


class Haystack:
    """Filler token ids of any length, and the places in them where a needle may go. RULER's
    noise repeats one line and takes the needle as a line of its own (lines=True); an essay takes
    it after a sentence end."""

    def __init__(self, tok, ids, lines=False):
        self.ids, self.lines = np.asarray(ids, dtype=np.int64), lines
        self.sep = "\n" if lines else " "  # what joins the needle to the text before it
        self.newline = tok.encode("\n")[0]
        self.ends = sentence_ends(tok)

    @classmethod
    def noise(cls, tok):
        return cls(tok, tok.encode("\n" + NOISE), lines=True)  # one line; sample() repeats it

    @classmethod
    def essays(cls, tok, path, vocab_size=None):
        r"""Held-out documents with every whitespace run made one space and run together, as RULER
        does with its essays (re.sub(r"\s+", " ", essay)): prose on one line, code and tables
        too."""
        ids = np.asarray(read_tokens(path, vocab_size))
        docs = np.split(ids, np.nonzero(ids == tok.eot_id)[0] + 1)  # each ends with its 0
        texts = (" ".join(tok.decode(d[d != tok.eot_id].tolist()).split()) for d in docs)
        return cls(tok, tok.encode(" ".join(t for t in texts if t)))

    def sample(self, n, rng):
        """n filler ids. The noise: its last n tokens, so that it ends on a full line. An essay: a
        random window that ends at a sentence end (the text repeats only if shorter than 2n)."""
        if self.lines:
            return np.tile(self.ids, n // len(self.ids) + 1)[-n:]
        ids = self.ids if len(self.ids) >= 2 * n else np.tile(self.ids, -(-2 * n // len(self.ids)))
        # window ends e >= n right after an end token
        stops = np.nonzero(self.ends[ids[n - 1:]])[0] + n
        stop = int(stops[rng.randrange(len(stops))]) if len(stops) else len(ids)
        return ids[stop - n:stop]

    def insert_at(self, hay, depth):
        """Index in hay where the needle goes: the place nearest to depth% of it, before a line
        break of the noise or after a sentence end of an essay."""
        # unrounded: rounding first can break a near-tie the wrong way
        target = depth / 100 * len(hay)
        if self.lines:
            cands = np.append(np.nonzero(hay == self.newline)[0], len(hay))
        else:
            cands = np.concatenate([[0], np.nonzero(self.ends[hay[:-1]])[0] + 1, [len(hay)]])
        return int(cands[np.abs(cands - target).argmin()])


def build_prompt(tok, hay, task, needle, length, depth, rng, chat=True):
    """Prompt ids of exactly `length` tokens and the index where the needle's ids start in them."""
    (key, value), v = needle, TASKS[task][1]
    head, question = INSTRUCTION.format(v=v), QUESTION.format(v=v, key=key)
    prefix = ANSWER_PREFIX.format(v=v, key=key)
    if chat:  # ChatML; the answer prefix opens the assistant's reply, as RULER's chat templates do
        ids, _ = tok.encode_chat([{"role": "user", "content": ""}], add_generation_prompt=True)
        j = len(ids) - 1 - ids[::-1].index(tok.im_end_id)  # the <|im_end|> closing the user turn
        pre = ids[:j] + tok.encode(head)
        post = tok.encode(question) + ids[j:] + tok.encode(prefix.lstrip())
    else:  # RULER's base template: the answer prefix follows the question
        pre, post = tok.encode(head), tok.encode(question + prefix)
    needle_ids = tok.encode(hay.sep + NEEDLE.format(v=v, key=key, value=value))
    n_hay = length - len(pre) - len(post) - len(needle_ids)
    if n_hay < 1:
        raise ValueError(f"length {length} is too short for the prompt template "
                         f"({length - n_hay} tokens)")
    filler = hay.sample(n_hay, rng)
    at = hay.insert_at(filler, depth)
    ids = pre + filler[:at].tolist() + needle_ids + filler[at:].tolist() + post
    return ids, len(pre) + at


def string_match(prediction, value):
    """RULER's niah score (string_match_all, one value): the value occurs in the answer."""
    return value.lower() in prediction.strip().lower()


# ---------------------------------------------------------------------------------------------
# Answering: one batched prefill, then greedy steps from the caches


@torch.no_grad()
def greedy(net, idx, max_new_tokens, **decoding):
    """Greedy continuation ids [B, max_new_tokens] of prompts idx [B, T]: the prompt goes through
    once (teacher: KV cache; student: chunked form into its state), then one token per step
    (decode.generate, which takes decoding: static, graph, compile; decode.options gives them for
    a --decoder)."""
    tokens = decode.generate(net, idx, max_new_tokens, temperature=0, **decoding)
    return torch.stack(list(tokens), 1)


def model_answerer(net, tok, device, **decoding):
    """prompts (list of equal-length id lists), max_new -> answer strings, cut at end of turn;
    decoding: greedy()'s."""
    stops = {tok.im_end_id, tok.eot_id}

    def answer(prompts, max_new):
        idx = torch.tensor(prompts, dtype=torch.long, device=device)  # (B, T)
        texts = []
        for row in greedy(net, idx, max_new, **decoding).tolist():
            cut = next((i for i, t in enumerate(row) if t in stops), len(row))
            texts.append(tok.decode(row[:cut]))
        return texts

    return answer


def run(answer, tok, haystacks, tasks, lengths, depths, samples, batch_size=4, chat=True, seed=1337,
        log=sys.stderr):
    """Every (task, length, depth, sample) prompt through answer(); a list of result dicts.
    haystacks: {"noise": Haystack, "essay": Haystack}, the ones the tasks use."""
    rng, records, t0 = random.Random(seed), [], time.time()
    per_length = len(tasks) * len(depths) * samples
    total = per_length * len(lengths)
    # the ETA counts prompt tokens, not prompts: a 4k prompt costs 8 times a 512 one (or more)
    work, work_done = sum(lengths) * per_length, 0
    for length in lengths:  # prompts of one length batch together, whatever their task
        jobs = []
        for task in tasks:
            for depth in depths:
                for _ in range(samples):
                    needle = make_needle(task, rng)
                    hay = haystacks[TASKS[task][0]]
                    ids, pos = build_prompt(tok, hay, task, needle, length, depth, rng, chat)
                    jobs.append(dict(task=task, length=length, depth=depth, needle_pos=pos,
                                     value=needle[1], ids=ids))
        for b in range(0, len(jobs), batch_size):
            batch = jobs[b:b + batch_size]
            # the value follows the answer prefix; 8 tokens of room for ":", "**" and the like
            # (RULER generates 128 tokens; a value further on would still count, but rarely comes)
            max_new = max(len(tok.encode(" " + j["value"])) for j in batch) + 8
            for j, pred in zip(batch, answer([j["ids"] for j in batch], max_new)):
                j.pop("ids")
                records.append(dict(j, prediction=pred, correct=string_match(pred, j["value"])))
            work_done += length * len(batch)
            rate = (time.time() - t0) / work_done
            print(f"\rniah: {len(records)}/{total} prompts, length {length}, "
                  f"{time.time() - t0:.0f}s, ~{rate * (work - work_done):.0f}s left", end="",
                  file=log, flush=True)
    print(file=log)
    return records


# ---------------------------------------------------------------------------------------------
# Reporting


def summarize(records):
    """{(task, length, depth or 'all'): accuracy}."""
    groups = {}
    for r in records:
        for d in (r["depth"], "all"):
            groups.setdefault((r["task"], r["length"], d), []).append(r["correct"])
    return {key: sum(v) / len(v) for key, v in groups.items()}


def table(acc, task, lengths, depths):
    """One task's accuracy (%) with depths as rows and lengths as columns."""
    rows = ["| depth \\ length | " + " | ".join(str(n) for n in lengths) + " |",
            "|---" * (len(lengths) + 1) + "|"]
    for d in list(depths) + ["all"]:
        label = "all depths" if d == "all" else f"{d:g}%"
        cells = " | ".join(f"{100 * acc[(task, n, d)]:.1f}" for n in lengths)
        rows.append(f"| {label} | {cells} |")
    return "\n".join(rows)


def heatmap(acc, tasks, lengths, depths, path, title):
    """One panel per task: depth by length, accuracy in %."""
    plt = plots.pyplot()

    w, h = 0.9 * len(lengths) + 1.4, 0.6 * len(depths) + 2.2  # one panel
    fig, axes = plt.subplots(1, len(tasks), figsize=(w * len(tasks) + 1.5, h), squeeze=False,
                             sharey=True, layout="constrained")
    for ax, task in zip(axes[0], tasks):
        # (depths, lengths)
        grid = np.array([[100 * acc[(task, n, d)] for n in lengths] for d in depths])
        im = ax.imshow(grid, cmap="RdYlGn", vmin=0, vmax=100, aspect="auto")
        for (i, j), v in np.ndenumerate(grid):
            ax.text(j, i, f"{v:.0f}", ha="center", va="center", fontsize=9)
        ax.set_xticks(range(len(lengths)), [str(n) for n in lengths])
        ax.set_yticks(range(len(depths)), [f"{d:g}%" for d in depths])
        ax.set_xlabel("context length (tokens)")
        name, what = TASKS[task][2].split(": ")
        ax.set_title(name + "\n" + what.replace(" (", "\n("), fontsize=9)
    axes[0][0].set_ylabel("needle depth")
    fig.colorbar(im, ax=axes[0].tolist(), label="string match (%)")
    fig.suptitle(title, fontsize=10)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None):
    clock = cli.Clock()  # where the seconds go: the last line
    s, tasks, lengths, depths = settings(argv)
    essays = any(TASKS[t][0] == "essay" for t in tasks)
    if essays and not os.path.exists(s.data):
        sys.exit(f"error: {s.data} not found: build it with {PREPARE} (or run --tasks=s_niah_1)")
    name = os.path.splitext(os.path.basename(checkpoint.label(s).rstrip("/")))[0]
    out_dir = s.out_dir or os.path.join("out", "niah", name)
    try:  # before any model loads or prompt runs: the results must have somewhere to go
        checkpoint.check_writable(out_dir, f"--out_dir={out_dir}")
        if essays:
            read_tokens(s.data)
    except ValueError as e:
        sys.exit(f"error: {e}")
    torch.manual_seed(s.seed)
    net, tok = checkpoint.load_from_settings(s)
    kinds = {TASKS[t][0] for t in tasks}
    try:
        haystacks = {k: Haystack.noise(tok) if k == "noise" else
                     Haystack.essays(tok, s.data, net.config.vocab_size) for k in kinds}
    except ValueError as e:
        sys.exit(f"error: {e}")
    print(f"{net.config.mixer} model ({name}), tasks {tasks}, lengths {lengths}, depths {depths}, "
          f"{s.samples} prompt(s) per cell, {s.device} {s.dtype}", file=sys.stderr)
    clock.mark("startup")  # settings, the model, the haystacks
    t0 = time.time()
    # --decoder, decided once for the device: static caches, CUDA graph, compiled blocks
    answer = model_answerer(net, tok, s.device, **decode.options(s.decoder, s.device))
    records = run(answer, tok, haystacks, tasks, lengths, depths, s.samples, s.batch_size,
                  not s.plain, s.seed)
    seconds = time.time() - t0
    clock.mark("prompts")  # prefills and greedy answers, compiling and CUDA graphs included
    acc = summarize(records)
    print(f"\nneedle in a haystack (RULER single needle), {name}: string match (%), "
          f"{len(records)} prompts in {seconds:.0f}s")
    for task in tasks:
        print(f"\n{TASKS[task][2]}\n\n{table(acc, task, lengths, depths)}")
    os.makedirs(out_dir, exist_ok=True)
    cells = [dict(task=t, length=n, depth=d, accuracy=a) for (t, n, d), a in acc.items()]
    used = {**asdict(s), "tasks": tasks, "lengths": lengths, "depths": depths}
    with open(os.path.join(out_dir, "results.json"), "w") as f:
        json.dump({"settings": used, "seconds": seconds, "accuracy": cells, "records": records}, f,
                  indent=1)
    with open(os.path.join(out_dir, "results.csv"), "w", newline="") as f:
        cols = ["task", "length", "depth", "needle_pos", "value", "prediction", "correct"]
        w = csv.DictWriter(f, cols)
        w.writeheader()
        w.writerows(records)
    heatmap(acc, tasks, lengths, depths, os.path.join(out_dir, "heatmap.png"),
            f"needle in a haystack: {name}")
    print(f"\nwrote {out_dir}/results.json, results.csv, heatmap.png")
    clock.mark("writing")
    print(clock.line())
    return acc


if __name__ == "__main__":
    main()
