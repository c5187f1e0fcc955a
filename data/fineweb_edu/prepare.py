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

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from data import common  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def main(argv=None):
    # FineWeb-Edu's sample-10BT config is a random 10B-token sample of the whole set
    args, where, options, records = common.hub_corpus(
        argv, __doc__, HERE, "HuggingFaceFW/fineweb-edu", "sample-10BT", 100_000_000, 0.005, "documents")
    if records is None:
        return
    tok = common.load_tokenizer(args.tokenizer)
    texts = common.field(records, "text", where)
    common.write_texts(args.out_dir, options, texts, tok, args.val_fraction, args.max_tokens, "fineweb-edu")


if __name__ == "__main__":
    main()
