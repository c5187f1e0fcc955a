"""
SmolLM2's tokenizer as a tiktoken Encoding, built from the checkpoint's own vocabulary.

SmolLM2 uses GPT-2 style byte-level BPE. Its vocabulary is laid out so that the token id *is*
the BPE merge rank: ids 0-16 are special tokens, 17-251 single byte characters, and 252.. the
merges in the order they were learned. That lets tiktoken's fast Rust BPE run it directly.

Two things differ from plain GPT-2:
1) Pre-tokenization first splits every digit into its own piece (the `tokenizers` library's
   Digits(individual_digits=True)), then applies the GPT-2 pattern inside each piece. We fold
   both into one regex: digits match alone, and the whitespace look-ahead treats a following
   digit like the end of a piece (plain `\\s+(?!\\S)` would split "a  1" differently).
2) 21 byte values have no token at all, and tiktoken aborts the whole process on such a byte.
   The reference `tokenizers` pipeline drops them inside each pre-tokenized piece and merges
   what is left. Text holding such a byte (rare: six ASCII control characters and code points
   U+40000-U+BFFFF) takes a slower path that does exactly that.

The vocabulary comes from a Hugging Face snapshot's tokenizer.json or a GGUF file's token list.
References: tiktoken (openai/tiktoken), GPT-2's byte-to-unicode table, SmolLM2's tokenizer.json.
"""

import json
import os
import re

import regex  # tiktoken's own dependency; for the rare path only
import tiktoken

# GPT-2's pattern with the digit split folded in: `\p{N}` alone (no leading space), and the
# whitespace run may end right before a digit, as it would at the end of a digit-split piece.
PATTERN = (
    r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+|\s+(?![^\s\p{N}])|\s+"""
)
# characters whose UTF-8 bytes include one of the 21 bytes SmolLM2's vocabulary lacks
# (0x04 0x06 0x13 0x14 0x16 0x1D; 0xF1 0xF2 lead U+40000-U+BFFFF; the rest never occur in UTF-8)
UNMAPPABLE = re.compile("[\x04\x06\x13\x14\x16\x1d\U00040000-\U000BFFFF]")
DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def byte_to_unicode():
    """GPT-2's reversible map from the 256 byte values to printable unicode characters."""
    # printable latin-1 bytes stand for themselves; the other 68 are shifted past 255
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    table, shift = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + shift)
            shift += 1
    return table


class Tokenizer:
    """Wraps a tiktoken Encoding with SmolLM2's special tokens and its ChatML template."""

    def __init__(self, tokens, special, name="smollm2"):
        # tokens: list of byte-level unicode strings, index = id; special: {string: id}
        unicode_to_byte = {u: b for b, u in byte_to_unicode().items()}
        ranks = {}
        for i, tok in enumerate(tokens):
            if tok in special:
                continue
            ranks[bytes(unicode_to_byte[ch] for ch in tok)] = i
        self.n_vocab = len(tokens)
        # tiktoken wants every byte to have a rank: give the missing ones private ranks past the
        # vocabulary. Encoding never emits them, since text holding them takes _encode_rare.
        self.missing = {b for b in range(256) if bytes([b]) not in ranks}
        for j, b in enumerate(sorted(self.missing)):
            ranks[bytes([b])] = self.n_vocab + j
        self.enc = tiktoken.Encoding(
            name=name,
            pat_str=PATTERN,
            mergeable_ranks=ranks,
            special_tokens={s: i for s, i in special.items()},
            explicit_n_vocab=self.n_vocab + len(self.missing),
        )
        self.special = dict(special)
        self.special_re = re.compile("(" + "|".join(re.escape(s) for s in special) + ")")
        self.pieces = regex.compile(PATTERN)
        self.eot_id = special.get("<|endoftext|>", 0)
        self.im_start_id = special.get("<|im_start|>", 1)
        self.im_end_id = special.get("<|im_end|>", 2)

    # ---- plain text ------------------------------------------------------------------------
    def _encode_rare(self, text):
        """Split into pieces, drop the unmappable bytes of each piece, merge the rest."""
        ids = []
        for piece in self.pieces.findall(text):
            b = bytes(x for x in piece.encode("utf-8", "surrogatepass") if x not in self.missing)
            if b:
                ids += self.enc._encode_single_piece(b)
        return ids

    def encode_ordinary(self, text):
        """Text -> ids; special-token strings are plain text."""
        if UNMAPPABLE.search(text):
            return self._encode_rare(text)
        return self.enc.encode_ordinary(text)

    def encode(self, text, allow_special=False):
        """Text -> ids. Special-token strings become their ids only when allow_special."""
        if not allow_special:
            return self.encode_ordinary(text)
        ids = []
        for i, part in enumerate(self.special_re.split(text)):  # odd parts are the specials
            ids += [self.special[part]] if i % 2 else self.encode_ordinary(part)
        return ids

    def encode_batch(self, texts, num_threads=8):
        """Many texts at once, in tiktoken's threads (the rare path runs serially)."""
        rare = [bool(UNMAPPABLE.search(t)) for t in texts]
        out = self.enc.encode_ordinary_batch(["" if r else t for t, r in zip(texts, rare)], num_threads=num_threads)
        return [self._encode_rare(t) if r else ids for t, r, ids in zip(texts, rare, out)]

    def decode(self, ids):
        return self.enc.decode(list(ids), errors="replace")

    def decode_bytes(self, ids):
        return self.enc.decode_bytes(list(ids))

    # ---- chat ------------------------------------------------------------------------------
    def encode_chat(self, messages, add_generation_prompt=False):
        """ChatML, as SmolLM2-Instruct's template renders it.

        messages: [{"role": ..., "content": ...}, ...]. A default system message is added when
        the first message is not a system one. Returns (ids, mask): mask[i] = 1 on the tokens
        an assistant wrote (its content and its <|im_end|>), the ones SFT learns from.
        """
        if messages and messages[0]["role"] != "system":
            messages = [{"role": "system", "content": DEFAULT_SYSTEM}] + list(messages)
        nl = self.encode("\n")
        ids, mask = [], []
        for m in messages:
            head = [self.im_start_id] + self.encode(m["role"] + "\n")
            body = self.encode(m["content"]) + [self.im_end_id]
            learn = 1 if m["role"] == "assistant" else 0
            ids += head + body + nl
            mask += [0] * len(head) + [learn] * len(body) + [0] * len(nl)
        if add_generation_prompt:
            head = [self.im_start_id] + self.encode("assistant\n")
            ids += head
            mask += [0] * len(head)
        return ids, mask


# ---------------------------------------------------------------------------------------------
# Loading the vocabulary


def read_gguf_vocab(path, reader=None):
    """(tokens, {special token: id}) of a GGUF file's byte-level BPE. reader: the file already
    open as a gguf.GGUFReader (opening one takes seconds)."""
    if reader is None:
        import gguf  # only needed for GGUF files

        reader = gguf.GGUFReader(path)
    fields = reader.fields
    if "tokenizer.ggml.tokens" not in fields:
        raise ValueError(f"{path}: GGUF file has no tokenizer.ggml.tokens; it holds no tokenizer")
    model = fields["tokenizer.ggml.model"].contents()
    if model != "gpt2":
        raise ValueError(f"{path}: tokenizer model is {model!r}; only byte-level BPE ('gpt2') is supported")
    tokens = fields["tokenizer.ggml.tokens"].contents()
    types = fields["tokenizer.ggml.token_type"].contents()
    special = {t: i for i, (t, ty) in enumerate(zip(tokens, types)) if ty == 3}  # 3 = control
    return tokens, special


def _from_tokenizer_json(path):
    with open(path, encoding="utf-8") as f:
        spec = json.load(f)
    vocab = spec["model"]["vocab"]  # {token string: id}
    tokens = [None] * (max(vocab.values()) + 1)
    for t, i in vocab.items():
        tokens[i] = t
    special = {a["content"]: a["id"] for a in spec.get("added_tokens", []) if a.get("special")}
    for a in spec.get("added_tokens", []):
        tokens[a["id"]] = a["content"]
    if any(t is None for t in tokens):
        raise ValueError(f"{path}: vocabulary ids are not contiguous")
    return tokens, special


def load_tokenizer(path):
    """The tokenizer of a local checkpoint: a GGUF file or a snapshot folder (tokenizer.json).
    checkpoint.load_tokenizer also takes 'default' and hub ids."""
    if os.path.isdir(path):
        tj = os.path.join(path, "tokenizer.json")
        if not os.path.exists(tj):
            raise FileNotFoundError(f"{path}: snapshot has no tokenizer.json")
        tokens, special = _from_tokenizer_json(tj)
    else:
        tokens, special = read_gguf_vocab(path)
    return Tokenizer(tokens, special)
