"""
SmolTalk, the instruction-tuning (SFT) corpus when a data hub is reachable.

HuggingFaceTB/smoltalk (Allal et al., "SmolLM2: When Smol Goes Big", 2025) is the chat mix
SmolLM2-Instruct was tuned on; the study fine-tunes its students on it for one epoch. Each
record has "messages", a list of {"role", "content"}. Conversations are rendered in ChatML by
tokenizer.encode_chat (the default system message is added where a conversation has none)
and written as:
  train.bin / val.bin            uint16 ids, each conversation followed by <|endoftext|>
  train_mask.bin / val_mask.bin  uint8, 1 on the tokens assistants wrote (their content and
                                 <|im_end|>): the only tokens SFT takes a loss on

    python data/smoltalk/prepare.py                           # config "all", every conversation
    python data/smoltalk/prepare.py --max_tokens=50000000     # a first slice
    python data/smoltalk/prepare.py --source=smoltalk.jsonl   # local file, offline

--source takes a .jsonl, .json or .parquet file (or folder) with a "messages" field.
Result: val = 1% of conversations by content hash. Not run on the project's offline machines
(no hub there); data/sharegpt is the offline stand-in in the same format.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from data import common  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def main(argv=None):
    # config 'all' or one of SmolTalk's subsets
    args, where, options, records = common.hub_corpus(
        argv, __doc__, HERE, "HuggingFaceTB/smoltalk", "all", 0, 0.01, "conversations")
    if records is None:
        return
    tok = common.load_tokenizer(args.tokenizer)
    # keep only role and content: hub records may carry extra keys per message
    chats = ([{"role": m["role"], "content": m["content"]} for m in msgs]
             for msgs in common.field(records, "messages", where))
    common.write_chats(args.out_dir, options, chats, tok, args.val_fraction, args.max_tokens, "smoltalk")


if __name__ == "__main__":
    main()
