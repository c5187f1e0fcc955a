"""The teacher: our SmolLM2 against transformers' own Llama, and the loader's error messages."""

import importlib.metadata
import json
import os
import pathlib

import pytest
import torch

import checkpoint
import decode
import model as M

transformers = pytest.importorskip("transformers")


def test_no_module_of_ours_hides_an_installed_package():
    # scripts and tests import the project's modules from the checkout, ahead of site-packages, so
    # a module named like an installed package hides that package from whoever imports it: from
    # transformers 5.25, which imports Hugging Face's `kernels`, when triton_ops.py was kernels.py
    root = pathlib.Path(__file__).resolve().parent.parent
    ours = {p.stem for p in root.glob("*.py")} | {p.parent.name for p in root.glob("*/__init__.py")}
    installed = importlib.metadata.packages_distributions()
    assert ours >= {"model", "mixers", "triton_ops", "data"}
    assert {name: installed[name] for name in ours if name in installed} == {}


def hf_gguf_teacher():
    path = checkpoint.default_gguf_path()
    return transformers.AutoModelForCausalLM.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.float32).eval()


def test_offline_teacher_matches_transformers(teacher):
    # transformers dequantizes the same GGUF and undoes the same permutation on its own
    hf = hf_gguf_teacher()
    torch.manual_seed(0)
    x = torch.randint(0, teacher.config.vocab_size, (2, 96))
    with torch.no_grad():
        ref, ours = hf(x).logits, teacher(x)
    assert (ref - ours).abs().max().item() <= 1e-4

    # 20 greedy tokens with our KV cache equal transformers' generate
    prompt = torch.tensor([[1, 4093, 198, 504, 3459, 282, 4649, 314, 2]])  # any ids will do
    ref_ids = hf.generate(prompt, max_new_tokens=20, do_sample=False, min_new_tokens=20)[0, prompt.shape[1]:]
    ours_ids = torch.stack(list(decode.plain(teacher, prompt, 20, temperature=0)), dim=1)[0]
    assert ours_ids.tolist() == ref_ids.tolist()


def test_teacher_config_read_from_gguf(teacher):
    c = teacher.config
    assert (c.n_layer, c.n_embd, c.n_head, c.n_kv_head, c.intermediate_size) == (30, 576, 9, 3, 1536)
    assert c.rope_theta == 100000.0 and c.tie_embeddings and c.vocab_size == 49152
    assert teacher.lm_head.weight is teacher.model.embed_tokens.weight


def test_gguf_cache_is_used(tmp_path, monkeypatch):
    # the second load reads the converted safetensors instead of dequantizing again
    monkeypatch.setattr(checkpoint, "CACHE_DIR", str(tmp_path))
    c1, s1 = checkpoint.read("default")
    assert any(f.startswith("gguf-") for f in os.listdir(tmp_path))
    monkeypatch.setattr(checkpoint, "read_gguf", lambda path: pytest.fail("cache was not used"))
    c2, s2 = checkpoint.read("default")
    assert c1 == c2 and all(torch.equal(s1[k], s2[k]) for k in s1)


def tiny_hf(tie, seed=0):
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(
        vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, rope_theta=5000.0, rms_norm_eps=1e-5, max_position_embeddings=256,
        tie_word_embeddings=tie)
    return transformers.LlamaForCausalLM(cfg).eval()


@pytest.mark.parametrize("tie,shard", [(True, False), (False, True)])
def test_safetensors_snapshot_matches_transformers(tmp_path, tie, shard):
    hf = tiny_hf(tie)
    hf.save_pretrained(tmp_path, max_shard_size="40KB" if shard else "5GB")
    assert os.path.exists(tmp_path / ("model.safetensors.index.json" if shard else "model.safetensors"))
    ours = checkpoint.load(str(tmp_path)).eval()
    assert ours.config.tie_embeddings == tie and ours.config.rope_theta == 5000.0
    x = torch.randint(0, 300, (2, 33))
    with torch.no_grad():
        assert (hf(x).logits - ours(x)).abs().max().item() < 1e-5
        # cached decoding (prefill, then one token at a time) equals the full forward
        caches = [dict() for _ in ours.model.layers]
        step = [ours(x[:, :20], caches=caches)] + [ours(x[:, t:t + 1], caches=caches, start=t) for t in range(20, 33)]
        assert (torch.cat(step, dim=1) - ours(x)).abs().max().item() < 1e-5


def test_own_checkpoint_roundtrip(tmp_path):
    net = M.SmolLM2(M.Config(vocab_size=100, n_layer=2, n_embd=32, n_head=4, n_kv_head=2, intermediate_size=48))
    checkpoint.save(str(tmp_path / "ckpt.pt"), net, step=7)
    back = checkpoint.load(str(tmp_path / "ckpt.pt"))
    assert back.config == net.config
    assert all(torch.equal(a, b) for a, b in zip(net.state_dict().values(), back.state_dict().values()))


def test_sliding_window_attention_decodes_like_full_forward():
    cfg = M.Config(vocab_size=100, n_layer=2, n_embd=32, n_head=4, n_kv_head=2, intermediate_size=48, mixer="swa", window=8)
    net = M.SmolLM2(cfg).eval()
    x = torch.randint(0, 100, (1, 30))
    with torch.no_grad():
        full = net(x)
        caches = [dict() for _ in net.model.layers]
        step = torch.cat([net(x[:, :12], caches=caches)] + [net(x[:, t:t + 1], caches=caches, start=t) for t in range(12, 30)], 1)
        assert caches[0]["k"].shape[2] == 8  # the cache never holds more than the window
        # two layers of window 8: the last output sees only the last 2 * (8 - 1) + 1 = 15 tokens
        y = x.clone()
        y[:, :30 - 15] = 0
        assert (net(y)[:, -1] - full[:, -1]).abs().max() < 1e-5
    assert (step - full).abs().max().item() < 1e-5


# ---- bad inputs give clear errors ------------------------------------------------------------


def test_missing_path():
    with pytest.raises(FileNotFoundError, match="no such file"):
        checkpoint.load("./does/not/exist.gguf")


def test_unknown_preset():
    with pytest.raises(ValueError, match="unknown preset 'smollm2-7b'.*smollm2-135m"):
        M.Config.from_preset("smollm2-7b")
    assert M.Config.from_preset("smollm2-360m").n_embd == 960


def test_wrong_format(tmp_path):
    p = tmp_path / "weights.bin"
    p.write_bytes(b"not a model at all")
    with pytest.raises(ValueError, match="unknown checkpoint format"):
        checkpoint.load(str(p))
    (tmp_path / "snap").mkdir()
    with pytest.raises(FileNotFoundError, match="no config.json"):
        checkpoint.load(str(tmp_path / "snap"))
    (tmp_path / "snap" / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(ValueError, match="only Llama"):
        checkpoint.load(str(tmp_path / "snap"))


LLAMA = dict(model_type="llama", vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2)


@pytest.mark.parametrize("text,why", [
    ('{"model_type": "llama",', "not valid JSON"),
    ("[1, 2]", "expected a JSON object, not list"),
    (json.dumps({k: v for k, v in LLAMA.items() if k != "hidden_size"}), "missing hidden_size"),
    (json.dumps({**LLAMA, "num_hidden_layers": "2"}), "num_hidden_layers must be a positive integer, not '2'"),
    (json.dumps({**LLAMA, "head_dim": 16.0}), "head_dim must be a positive integer"),
    (json.dumps({**LLAMA, "rope_theta": "10000"}), "rope_theta must be a positive number"),
    (json.dumps({**LLAMA, "tie_word_embeddings": "false"}), "tie_word_embeddings must be true or false"),
    (json.dumps({**LLAMA, "rope_scaling": [1]}), "rope_parameters must be an object"),
])
def test_a_bad_config_json_is_named(tmp_path, text, why):
    # one line that names the file and what is wrong in it, before any weights are read
    (tmp_path / "config.json").write_text(text)
    with pytest.raises(ValueError) as err:
        checkpoint.load(str(tmp_path))
    msg = str(err.value)
    assert msg.startswith(f"{tmp_path / 'config.json'}: ") and why in msg and "\n" not in msg, msg


def test_truncated_files(tmp_path):
    gguf_bytes = open(checkpoint.default_gguf_path(), "rb").read(1 << 20)  # first MiB of the real file
    (tmp_path / "cut.gguf").write_bytes(gguf_bytes)
    with pytest.raises(ValueError, match="cut.gguf"):
        checkpoint.load(str(tmp_path / "cut.gguf"))
    hf = tiny_hf(True)
    hf.save_pretrained(tmp_path / "snap")
    st = tmp_path / "snap" / "model.safetensors"
    st.write_bytes(st.read_bytes()[:5000])
    with pytest.raises(ValueError, match="cannot read safetensors"):
        checkpoint.load(str(tmp_path / "snap"))


def test_mismatched_weights(tmp_path):
    hf = tiny_hf(True)
    hf.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["intermediate_size"] = 128  # config and weights disagree
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="shape"):
        checkpoint.load(str(tmp_path))


def test_hub_id_without_network_says_how_to_get_weights(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match="huggingface-cli download HuggingFaceTB/SmolLM2-360M"):
        checkpoint.load("HuggingFaceTB/SmolLM2-360M")


def test_hub_id_from_local_cache(monkeypatch, tmp_path):
    snap = tmp_path / "models--someone--tiny" / "snapshots" / "abc123"
    tiny_hf(True).save_pretrained(snap)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    assert checkpoint.load("someone/tiny").config.n_embd == 64
