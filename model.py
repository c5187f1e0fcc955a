"""
Full definition of a SmolLM2 language model (the Llama architecture), in one file.

The teacher is a plain Llama: RMSNorm, rotary position embeddings in the rotate-half
convention, grouped-query attention through scaled_dot_product_attention (written out as a
masked softmax in the else-branch), a SwiGLU MLP and embeddings tied to the LM head. A student
is the same model with another token mixer in place of softmax attention (config.mixer, built
by mixers.py). Module names follow the Hugging Face checkpoint, so that checkpoint.py loads
weights as a strict copy. The architecture alone: forward() takes per-layer caches, and
decode.py turns them into tokens (sampling, the plain loop, static caches).

References:
1) SmolLM2 model cards and config.json files (HuggingFaceTB)
2) Llama: Touvron et al. 2023; RoFormer (rotary embeddings): Su et al. 2021
3) karpathy/nanoGPT model.py, for the shape of this file
"""

import math
from dataclasses import dataclass, fields
from typing import NamedTuple

import torch
import torch.nn as nn
import torch.nn.functional as F

import mixers


@dataclass
class Config:
    vocab_size: int = 49152  # SmolLM2's byte-level BPE vocabulary (fits in uint16)
    n_layer: int = 30  # transformer blocks
    n_embd: int = 576  # residual stream width
    n_head: int = 9  # query heads (head_dim = n_embd // n_head = 64)
    n_kv_head: int = 3  # key/value heads: grouped-query attention shares each over n_head/n_kv_head
    intermediate_size: int = 1536  # SwiGLU hidden width
    rope_theta: float = 100000.0  # rotary base; read it from the checkpoint, it differs per model
    rms_eps: float = 1e-5  # RMSNorm epsilon
    max_seq_len: int = 8192  # context the teacher was trained for (rotary works past it, untested)
    tie_embeddings: bool = True  # lm_head shares the token embedding matrix, as in SmolLM2
    # --- students (mixers.py); the teacher is mixer="attention" ---
    mixer: str = "attention"  # every layer's token mixer: "attention", "swa" or in mixers.MIXERS
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


PRESETS = {  # architecture of the released SmolLM2 sizes (their config.json files on the hub)
    "smollm2-135m": dict(n_layer=30, n_embd=576, n_head=9, n_kv_head=3, intermediate_size=1536),
    "smollm2-360m": dict(n_layer=32, n_embd=960, n_head=15, n_kv_head=5, intermediate_size=2560),
    "smollm2-1.7b": dict(n_layer=24, n_embd=2048, n_head=32, n_kv_head=32, intermediate_size=8192,
                         rope_theta=130000.0),
}


# ---------------------------------------------------------------------------------------------
# Building blocks


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        # normalize in fp32, as the reference implementation does, then scale in x's dtype (the
        # mixers' output norm, mixers.rms_norm_gate, without its gate)
        xf = x.float()
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * normed.to(x.dtype)


def rope_cos_sin(positions, head_dim, theta, device=None):
    """Rope for integer positions: cos, sin [T, head_dim] in the rotate-half layout (both halves
    repeat)."""
    channels = torch.arange(0, head_dim, 2, device=device, dtype=torch.float32)
    inv_freq = 1.0 / (theta ** (channels / head_dim))
    angles = positions.to(device=device, dtype=torch.float32)[:, None] * inv_freq  # (T, D/2)
    angles = torch.cat([angles, angles], dim=-1)  # (T, D)
    return Rope(angles.cos(), angles.sin())


class Rope(NamedTuple):
    """The rotary embedding of T positions: cos, sin [T, D]. rope(x) rotates x [B, T, H, D]."""

    cos: torch.Tensor
    sin: torch.Tensor

    def __call__(self, x):
        return apply_rotary(x, self.cos, self.sin)


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
        self.n_head, self.n_kv_head = config.n_head, config.n_kv_head
        self.head_dim, self.window = config.head_dim, window
        # "naive": the attention written out below; else scaled_dot_product_attention
        self.backend = None
        self.q_proj = nn.Linear(config.n_embd, self.n_head * self.head_dim, bias=False)
        self.k_proj = nn.Linear(config.n_embd, self.n_kv_head * self.head_dim, bias=False)
        self.v_proj = nn.Linear(config.n_embd, self.n_kv_head * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.n_head * self.head_dim, config.n_embd, bias=False)

    def qkv(self, x, rope):
        """x [B, T, C] -> q [B, H, T, D], k and v [B, n_kv_head, T, D], q and k rotated."""
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_head, self.head_dim)
        k = self.k_proj(x).view(B, T, self.n_kv_head, self.head_dim)
        v = self.v_proj(x).view(B, T, self.n_kv_head, self.head_dim)
        q, k = rope(q), rope(k)
        return (t.transpose(1, 2) for t in (q, k, v))  # (B, H, T, D)

    def forward(self, x, rope, cache=None):
        B, T, _ = x.shape
        q, k, v = self.qkv(x, rope)
        if cache is not None:  # decoding: append to the keys and values seen so far
            if "k" in cache:
                k, v = torch.cat([cache["k"], k], dim=2), torch.cat([cache["v"], v], dim=2)
            keep = self.window if self.window > 0 else k.shape[2]  # a window bounds the cache
            cache["k"], cache["v"] = k[:, :, -keep:], v[:, :, -keep:]
        rep = self.n_head // self.n_kv_head  # each KV head serves `rep` query heads
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        S = k.shape[2]  # keys: those cached before, then these T; the queries sit at the end
        # FlashAttention's causal square
        plain = S == T and self.window == 0 and self.backend != "naive"
        if not plain:  # (T, S): the keys each query sees, causal and inside the window
            qi = torch.arange(S - T, S, device=x.device)[:, None]
            kj = torch.arange(S, device=x.device)[None, :]
            mask = (kj <= qi) & (kj > qi - self.window) if self.window > 0 else kj <= qi
        if self.backend != "naive":
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=None if plain else mask,
                                               is_causal=plain)
        else:  # the same attention written out
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(self.head_dim))  # (B, H, T, S)
            att = att.masked_fill(~mask, float("-inf")).float().softmax(dim=-1).to(q.dtype)
            y = att @ v  # (B, H, T, D)
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


MIXERS = ("attention", "swa") + mixers.MIXERS  # every token mixer a model can have


def check_mixer(name, allowed=MIXERS):
    """name, or a one-line ValueError that lists the valid names."""
    if name not in allowed:
        raise ValueError(f"unknown mixer {name!r}; valid mixers: {', '.join(allowed)}")
    return name


def build_token_mixer(config, layer_idx):
    """Softmax attention for the teacher and for a hybrid student's kept layers, else a mixer."""
    if config.mixer == "attention" or layer_idx in config.softmax_layers:
        return Attention(config)
    if check_mixer(config.mixer) == "swa":
        return Attention(config, window=config.window)
    return mixers.LAYERS[config.mixer](config, layer_idx)


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
        """The Rope of positions start .. start + T - 1 (start an int, or a 0-d tensor on the
        device)."""
        positions = torch.arange(T, device=device) + start
        return rope_cos_sin(positions, self.config.head_dim, self.config.rope_theta, device)

    def hidden(self, idx, caches=None, start=0, last_only=False):
        """idx [B, T] -> the final hidden states [B, T, C] that the LM head reads (after the
        last norm); forward's arguments (below). Training losses take these and apply the head
        themselves, a slice of rows at a time."""
        x = self.model.embed_tokens(idx)  # (B, T, C)
        rope = self.rope(idx.shape[1], start, idx.device)
        for i, block in enumerate(self.model.layers):
            x = block(x, rope, None if caches is None else caches[i])
        if last_only:
            x = x[:, -1:]
        return self.model.norm(x)

    def forward(self, idx, targets=None, caches=None, start=0, last_only=False):
        """idx [B, T] token ids -> logits [B, T, V] (and the mean cross-entropy with targets).

        caches: None for training, or one dict per layer for decoding, where `start` is the
        position of idx[:, 0] in the sequence. last_only: logits of the last position only,
        [B, 1, V] (a long prompt's full logits would take gigabytes).
        """
        logits = self.lm_head(self.hidden(idx, caches, start, last_only))  # (B, T, V)
        if targets is None:
            return logits
        loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), ignore_index=-1)
        return logits, loss

    def set_backend(self, backend):
        """The backend every token mixer runs on: "naive", "torch" or "triton" (mixers.BACKENDS), or
        None for the default (triton for CUDA tensors, torch otherwise). Softmax attention runs
        written out under "naive", through scaled_dot_product_attention otherwise."""
        mixers.check_backend(backend)
        for m in self.modules():
            if isinstance(m, (Attention, mixers.MixerLayer)):
                m.backend = backend
        return self

    def num_params(self):
        return sum(p.numel() for p in self.parameters())  # tied weights count once
