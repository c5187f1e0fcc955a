"""Our tiktoken tokenizer against the reference `tokenizers` pipeline built from the same vocabulary.

transformers' GGUF tokenizer omits SmolLM2's digit split, so the reference is assembled here the
way SmolLM2's tokenizer.json specifies it: Digits(individual_digits=True), then ByteLevel BPE.
"""

import glob
import json
import os
import random
import sysconfig

import pytest

import checkpoint
import tokenizer as T

tokenizers = pytest.importorskip("tokenizers")
gguf = pytest.importorskip("gguf")


@pytest.fixture(scope="module")
def reference():
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    r = gguf.GGUFReader(checkpoint.default_gguf_path())
    tokens = r.fields["tokenizer.ggml.tokens"].contents()
    merges = [tuple(m.split(" ")) for m in r.fields["tokenizer.ggml.merges"].contents()]
    ref = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    ref.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    ref.decoder = decoders.ByteLevel()
    ref.add_special_tokens([AddedToken(t, special=True) for t in tokens[:17]])
    template = r.fields["tokenizer.chat_template"].contents()
    return ref, template


HARD = [
    "a  1", "a 1", "x\t\t2", "   ", "\n\n\n", " \n 1 \n", "1234567890123456789", "3.14159e-10 and $1,000,000.00",
    "emoji 🤖🎉👩‍👩‍👧 ünïcödé 中文 русский العربية", "def f(x):\n\tif x:\n        return x ** 2  # square\n",
    "it's they're we've I'm you'll he'd IT'S", "Ⅻ ½ ² ٣ ⁴ ①", "\u00a0nbsp\u2003em\u3000ideographic 1",
    "trailing spaces   ", "   leading", "tabs\tand\nnewlines\r\nmixed \t \n 9", "<|im_start|> is plain text here",
    "\x04\x06\x13\x14\x16\x1d control bytes the vocabulary lacks", "\U00040001 and \U000bfffe beyond",
    "a\x04b", "'\x04'll", " \x04, 9", "".join(chr(i) for i in range(0, 512)),
]


def corpus(n_code=2000, n_fuzz=2000):
    """Thousands of varied documents, all available offline: the Python standard library's
    source (code, prose in docstrings, numbers) plus random mixtures of the hard cases."""
    docs = list(HARD)
    files = sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "**", "*.py"), recursive=True))
    rng = random.Random(0)
    for path in rng.sample(files, min(len(files), n_code // 4)):
        text = open(path, encoding="utf-8", errors="replace").read()
        for _ in range(4):  # four random slices per file
            i = rng.randrange(max(1, len(text)))
            docs.append(text[i:i + rng.randint(1, 3000)])
    alphabet = list("abcXYZ 0123456789 \t\n\r.,;:'\"!?-_()[]{}$%éüß中文日本🤖👍\u00a0\u2003\u3000") + \
        ["'s", "'ll", "  1", " 12", "\x04", "\x1d", "ÿ", "\U00050000", "http://x.io/a?b=1", "  \n  "]
    for _ in range(n_fuzz):
        docs.append("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 80))))
    return docs


def test_matches_reference_on_varied_corpus(tok, reference):
    ref, _ = reference
    docs = corpus()
    assert len(docs) > 3000
    # the reference knows the special tokens, so compare with special-token parsing on
    bad = [d for d in docs if tok.encode(d, allow_special=True) != ref.encode(d, add_special_tokens=False).ids]
    assert not bad, f"{len(bad)} mismatches, first: {bad[0][:80]!r}"
    # the batch path agrees with the one-at-a-time path
    assert tok.encode_batch(docs[:500]) == [tok.encode(d) for d in docs[:500]]
    assert tok.im_start_id not in tok.encode("<|im_start|> is plain text here")


def test_roundtrip_and_unmappable_bytes(tok):
    text = "Hello, wörld! 12 🤖\n\tend"
    assert tok.decode(tok.encode(text)) == text
    # bytes without a token are dropped, never a crash (tiktoken alone aborts the process)
    ids = tok.encode("a\x04b\x1d")
    assert all(0 <= i < tok.n_vocab for i in ids) and tok.decode(ids) == "ab"


def test_special_tokens(tok):
    assert (tok.eot_id, tok.im_start_id, tok.im_end_id) == (0, 1, 2)
    assert tok.encode("<|im_end|>", allow_special=True) == [2]
    assert tok.encode("<|im_end|>") != [2]  # plain text unless asked


def test_chat_template_matches_the_checkpoints_own(tok, reference):
    jinja2 = pytest.importorskip("jinja2")
    ref, template = reference
    convs = [
        [{"role": "user", "content": "What is 17 * 23?"}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
         {"role": "assistant", "content": "Hello! 👋"}, {"role": "user", "content": "Tell me\n a joke"}],
    ]
    for messages in convs:
        for gen in (False, True):
            text = jinja2.Template(template).render(messages=messages, add_generation_prompt=gen)
            ids, mask = tok.encode_chat(messages, add_generation_prompt=gen)
            assert ids == ref.encode(text, add_special_tokens=False).ids
            assert len(mask) == len(ids)


def test_chat_mask_covers_exactly_the_assistant_replies(tok):
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello there."},
                {"role": "user", "content": "Bye"}, {"role": "assistant", "content": "Goodbye!"}]
    ids, mask = tok.encode_chat(messages)
    learned = [i for i, m in zip(ids, mask) if m]
    assert learned == tok.encode("Hello there.") + [tok.im_end_id] + tok.encode("Goodbye!") + [tok.im_end_id]


def test_snapshot_tokenizer_json(tmp_path, tok, reference):
    # a snapshot's tokenizer.json gives the same tokenizer as the GGUF token list
    ref, _ = reference
    ref.save(str(tmp_path / "tokenizer.json"))
    spec = json.loads((tmp_path / "tokenizer.json").read_text())
    assert spec["model"]["vocab"]
    t2 = T.Tokenizer(*T._from_tokenizer_json(str(tmp_path / "tokenizer.json")))
    for d in HARD:
        assert t2.encode(d) == tok.encode(d)


def test_converting_the_teacher_parses_its_file_once_for_the_weights_and_the_vocabulary(tmp_path, monkeypatch,
                                                                                          reference):
    monkeypatch.setattr(checkpoint, "CACHE_DIR", str(tmp_path))
    opened, real = [], gguf.GGUFReader
    monkeypatch.setattr(gguf, "GGUFReader", lambda path: opened.append(path) or real(path))
    checkpoint.read("default")  # converts the weights, and caches the vocabulary from the same reader
    tok = checkpoint.load_tokenizer("default")
    assert len(opened) == 1
    ref, _ = reference
    for text in HARD + ["<|im_start|>user\nhi<|im_end|>"]:
        assert tok.encode(text, allow_special=True) == ref.encode(text).ids, text


def test_the_vocabulary_cached_beside_the_weights_is_the_gguf_files(tmp_path, monkeypatch, reference):
    monkeypatch.setattr(checkpoint, "CACHE_DIR", str(tmp_path))
    first = checkpoint.load_tokenizer("default")  # read from the GGUF file, then cached
    assert glob.glob(str(tmp_path / "gguf-*" / "vocab.json"))
    cached = checkpoint.load_tokenizer("default")
    ref, _ = reference
    for text in HARD:
        assert cached.encode(text) == first.encode(text), text  # first: checked against ref above
        assert cached.decode(cached.encode(text)) == first.decode(first.encode(text))
    chat = "<|im_start|>user\nhi<|im_end|>"
    assert cached.encode(chat, allow_special=True) == ref.encode(chat).ids
    assert (cached.eot_id, cached.im_start_id, cached.im_end_id) == (0, 1, 2)
