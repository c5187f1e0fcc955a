"""
FineWeb-Edu, the distillation corpus when a data hub is reachable.

HuggingFaceFW/fineweb-edu is FineWeb filtered for educational value (Penedo et al., "The
FineWeb Datasets", 2024); its sample configs (sample-10BT, -100BT, -350BT) are random subsets.
It is streamed through the `datasets` library, so only the first --max_tokens worth of
documents are downloaded, and written nanoGPT style: uint16 train.bin / val.bin, each
document followed by <|endoftext|>.

    python data/fineweb_edu/prepare.py                            # 100M tokens of sample-10BT
    python data/fineweb_edu/prepare.py --max_tokens=3000000000    # the study's stage-3 budget
    python data/fineweb_edu/prepare.py --source=shards/           # local .parquet/.jsonl, offline

--source takes a .jsonl, .json or .parquet file (or a folder of them) whose records have a
"text" field, as the hub's parquet shards do. Result: --max_tokens tokens in all (the last
batch may overshoot by a few documents), val = 0.5% of documents by content hash, about
2 bytes per token on disk. Not run on the project's offline machines (no hub there).
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from data import common  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--source", default="", help="local .jsonl/.parquet file or folder; empty: the hub")
    p.add_argument("--dataset", default="HuggingFaceFW/fineweb-edu", help="hub dataset")
    p.add_argument("--config", default="sample-10BT", help="hub config (a random sample of FineWeb-Edu)")
    p.add_argument("--max_tokens", type=int, default=100_000_000, help="stop after this many tokens (0: all)")
    p.add_argument("--val_fraction", type=float, default=0.005, help="share of documents in val")
    p.add_argument("--out_dir", default=HERE, help="where train.bin, val.bin, meta.json go")
    p.add_argument("--tokenizer", default="default", help="load_tokenizer() argument")
    p.add_argument("--force", action="store_true", help="rebuild even if already prepared")
    args = p.parse_args(argv)

    where = os.path.abspath(args.source) if args.source else f"{args.dataset}:{args.config}"
    options = {"source": where, "max_tokens": args.max_tokens, "val_fraction": args.val_fraction,
               "tokenizer": args.tokenizer}
    if not args.force and common.already_prepared(args.out_dir, options):
        return
    records = common.open_dataset(args.source, args.dataset, args.config)
    tok = common.load_tokenizer(args.tokenizer)
    texts = common.field(records, "text", where)
    common.write_texts(args.out_dir, options, texts, tok, args.val_fraction, args.max_tokens, "fineweb-edu")


if __name__ == "__main__":
    main()
