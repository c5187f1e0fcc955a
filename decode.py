"""
Decoding: tokens from any model (teacher, student, hybrid), one at a time, either through the
model's own caches (plain) or through a one-token step on static caches, which a GPU replays
from a CUDA graph.

    opts = decode.options("auto", idx.device)     # --decoder, resolved once for the device
    for nxt in decode.generate(net, idx, 32, temperature=0, **opts):   # sample.py and niah.py
        ...

The plain loop (plain() below) runs model.SmolLM2.forward on each new token with the caches it
grows: the keys and values of softmax attention, a mixer's recurrent state and conv tail. Each
step launches every kernel of every layer from Python, and at 135M parameters and a small batch
the GPU mostly waits for the host. The static step reads the prompt as the plain loop does
(chunked forms, FlashAttention), then makes the caches buffers whose shapes never change:
  - a mixer's recurrent state and conv tail keep their shapes: a step writes the new ones over
    the old (copy_);
  - softmax attention keeps its keys and values in a buffer of fixed length W (the prompt and
    every token to come, or the window of sliding-window attention) written at slot pos % W,
    with each slot's position beside it, and attends over the whole buffer, masked to the slots
    the token may see (attention_step below; gpt-fast's static KV cache).
One step (the model on the last token at position pos, the caches updated, pos advanced) is
captured once in a CUDA graph and replayed for every token; sampling stays outside it. A replay
still runs every kernel the step holds, some 45 a block, each a few microseconds of fixed cost;
so on a GPU each block first goes through torch.compile, which fuses its norms, activations and
gates into a few kernels, one compilation shared by every block of a kind. On a CPU the same
static step runs eagerly: the tests compare it, compiled and not, with the plain loop.

References:
1) meta-pytorch/gpt-fast, generate.py (a static KV cache; the decoding step under CUDA graphs)
2) PyTorch, "CUDA Graphs" in the CUDA semantics notes (warm-up on a side stream, static inputs
   and outputs, capture records and does not run)
"""

import math

import torch
import torch.nn.functional as F

import model as M

SLOTS = 512  # a static cache longer than this holds a whole number of slices of SLOTS slots


def static_caches(net, caches, T, total):
    """Turn the caches of a prefill of T tokens into static ones for decoding up to `total`
    positions (in place); returns the position tensor they share, at T."""
    dev = next(net.parameters()).device
    pos = torch.tensor(T, device=dev)
    for block, cache in zip(net.model.layers, caches):
        attn = block.self_attn
        if not isinstance(attn, M.Attention):
            continue  # a mixer's state and conv tail are static as they are
        k, v = cache["k"], cache["v"]  # (B, n_kv, n, D): the last n positions of the prompt
        W = min(attn.window, total) if attn.window > 0 else total
        if W > SLOTS:  # a whole number of slices of slots; a ring longer than its window still
            W = -(-W // SLOTS) * SLOTS  # holds the window (the mask hides older positions)
        B, H, n, D = k.shape
        positions = torch.arange(T - n, T, device=dev)
        slots = positions % W
        cache["k"], cache["v"] = k.new_zeros(B, H, W, D), v.new_zeros(B, H, W, D)
        cache["k"][:, :, slots], cache["v"][:, :, slots] = k, v
        cache["slot_pos"] = torch.full((W,), -1, dtype=torch.long, device=dev)
        cache["slot_pos"][slots] = positions
        cache["pos"] = pos
    return pos


def attention_step(attn, x, rope, cache):
    """Softmax attention (a model.Attention) of one new token x [B, 1, C] over its static cache:
    keys and values [B, n_kv, W, D], written at slot pos % W, and slot_pos [W] the position each
    slot holds (-1: empty); cache["pos"] is the token's position, a 0-d tensor. No shape depends
    on pos, so the step can be captured in a CUDA graph. Returns [B, 1, C]."""
    q, k, v = attn.qkv(x, rope)  # (B, H, 1, D), (B, n_kv, 1, D) twice
    pos, slot_pos = cache["pos"], cache["slot_pos"]
    slot = (pos % slot_pos.shape[0]).view(1)
    cache["k"].index_copy_(2, slot, k.to(cache["k"].dtype))
    cache["v"].index_copy_(2, slot, v.to(cache["v"].dtype))
    slot_pos.index_copy_(0, slot, pos.view(1))
    mask = (slot_pos >= 0) & (slot_pos <= pos)  # (W,): the slots this token sees
    if attn.window > 0:
        mask = mask & (slot_pos > pos - attn.window)
    # written out: the `rep` query heads of a KV head are its queries at one position, so the
    # cache is read as it is, never repeated for the query heads
    k, v = cache["k"], cache["v"]  # (B, n_kv, W, D)
    B, H, _, D = q.shape
    n, W = attn.n_kv_head, k.shape[2]
    q, kt = q.reshape(B * n, H // n, D), k.view(B * n, W, D).transpose(1, 2)
    # scores in fp32, as FlashAttention keeps them: a bf16 product would round them first. On
    # CUDA the product reads the bf16 cache as it is and sums and writes in fp32; elsewhere
    # the same numbers come from fp32 copies
    if q.is_cuda and q.dtype in (torch.bfloat16, torch.float16):
        att = torch.bmm(q, kt, out_dtype=torch.float32)
    else:
        att = torch.bmm(q.float(), kt.float())
    att = att.view(B, n, H // n, W) * (1.0 / math.sqrt(D))  # (B, n_kv, rep, W)
    p = att.masked_fill(~mask, float("-inf")).softmax(dim=-1).to(v.dtype)
    # p @ v over W slots as S products over slices of SLOTS slots, then summed: one product of
    # two short sides over a long one would keep only a few of a GPU's cores busy
    S = W // SLOTS if W % SLOTS == 0 else 1
    y = (p.view(B, n, -1, S, W // S).transpose(2, 3) @ v.view(B, n, S, W // S, D)).float().sum(2)
    return attn.o_proj(y.to(v.dtype).reshape(B, H * D)[:, None])  # (B, 1, C)


def block_step(block, x, rope, cache):
    """One block (model.Block.forward's two lines) on one token, its cache written in place: the
    buffers a CUDA graph reads and writes stay the same."""
    h = block.input_layernorm(x)
    if isinstance(block.self_attn, M.Attention):
        a = attention_step(block.self_attn, h, rope, cache)
    else:  # a mixer's new state and conv tail, of the old ones' shapes, written over them (copy_)
        work = dict(cache)
        a = block.self_attn(h, rope, work)
        for key, t in work.items():
            if t is not cache[key]:
                cache[key].copy_(t)
    x = x + a
    return x + block.mlp(block.post_attention_layernorm(x))


class Decoder:
    """One batch of prompts idx [B, T] read, then decoded a token at a time.

    Decoder(net, idx, max_new_tokens).logits are the prompt's next-token logits [B, V];
    step(tokens [B]) feeds one token a sequence and returns the next logits [B, V] (a buffer that
    the next step overwrites). graph: capture the step in a CUDA graph (CUDA tensors only);
    compile: run each block through torch.compile, which fuses a block's elementwise work into a
    few kernels (options() sets both on CUDA: a replayed step still launches every kernel it
    holds)."""

    @torch.no_grad()
    def __init__(self, net, idx, max_new_tokens, graph=False, compile=False):
        if graph and not idx.is_cuda:
            raise ValueError("a CUDA graph captures CUDA work: graph=True needs CUDA tensors")
        self.net = net
        self.block = block_step
        if compile:
            # one compilation serves every block of a kind (they differ only in their weights);
            # a process may decode several models and prompt lengths, each a compilation
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
            self.block = torch.compile(block_step)
        B, T = idx.shape
        self.caches = [dict() for _ in net.model.layers]
        self.logits = net(idx, caches=self.caches, last_only=True)[:, -1]
        self.pos = static_caches(net, self.caches, T, T + max_new_tokens)
        self.tok = idx.new_zeros(B, 1)  # the step's input: every step copies its tokens in here
        self.graph = None
        if graph:
            self.capture()

    def _step(self):
        net = self.net  # model.SmolLM2.hidden on one token, each block through block_step
        x = net.model.embed_tokens(self.tok)  # (B, 1, C)
        rope = net.rope(1, self.pos, x.device)
        for block, cache in zip(net.model.layers, self.caches):
            x = self.block(block, x, rope, cache)
        self.pos += 1
        return net.lm_head(net.model.norm(x))[:, -1]

    def capture(self):
        """Record _step in a CUDA graph: two warm-up steps on a side stream (first calls compile
        Triton kernels and create cuBLAS handles, which a capture may not), the caches put back
        as they were, then the capture itself, which records and runs nothing."""
        saved = [{k: t.clone() for k, t in c.items() if k != "pos"} for c in self.caches]
        pos = self.pos.clone()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                self._step()
        torch.cuda.current_stream().wait_stream(stream)
        for cache, old in zip(self.caches, saved):
            for k, t in old.items():
                cache[k].copy_(t)
        self.pos.copy_(pos)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.out = self._step()

    @torch.no_grad()
    def step(self, tokens):
        self.tok.copy_(tokens.view(-1, 1))
        if self.graph is None:
            return self._step()
        self.graph.replay()
        return self.out


def pick(logits, temperature=1.0, top_k=None):
    """Next token ids [B] from logits [B, V]: the argmax at temperature 0, else a sample of the
    softened distribution, restricted to the top_k most likely tokens when given."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits.float() / temperature
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.multinomial(F.softmax(logits, dim=-1), num_samples=1)[:, 0]


@torch.no_grad()
def plain(net, idx, max_new_tokens, temperature=1.0, top_k=None):
    """Yields the next token ids [B], one step at a time, from prompt ids idx [B, T], through the
    model's own caches: the prompt goes through once, then each new token reuses the per-layer
    caches (keys and values for attention, which grow; the recurrent state for students).
    temperature 0 is greedy."""
    caches = [dict() for _ in net.model.layers]
    logits = net(idx, caches=caches, last_only=True)[:, -1, :]
    pos = idx.shape[1]
    for i in range(max_new_tokens):
        nxt = pick(logits, temperature, top_k)
        yield nxt
        if i + 1 < max_new_tokens:  # no step past the last token
            logits = net(nxt[:, None], caches=caches, start=pos)[:, -1, :]
            pos += 1


DECODERS = ("auto", "fast", "plain")  # --decoder's choices (sample.py, niah.py)


def options(decoder, device):
    """--decoder -> generate's static, graph and compile, decided once for the device. fast:
    static caches, and on CUDA each block compiled and the step replayed from a CUDA graph (a CPU
    runs the static step eagerly); plain: plain()'s growing caches; auto: fast on CUDA, plain
    otherwise."""
    if decoder not in DECODERS:
        raise ValueError(f"unknown decoder {decoder!r}; valid decoders: {', '.join(DECODERS)}")
    cuda = str(device).startswith("cuda")
    static = decoder == "fast" or (decoder == "auto" and cuda)
    return dict(static=static, graph=static and cuda, compile=static and cuda)


def generate(net, idx, max_new_tokens, temperature=1.0, top_k=None, static=False, graph=False,
             compile=False):
    """The next token ids [B], one step at a time: through a Decoder when static (graph and
    compile as Decoder takes them), else through plain()'s caches. options() gives the three for
    a --decoder and a device."""
    if not static:
        if graph or compile:
            raise ValueError("graph and compile are ways of running the static step: static=True")
        yield from plain(net, idx, max_new_tokens, temperature, top_k)
        return
    dec = Decoder(net, idx, max_new_tokens, graph=graph, compile=compile)
    logits = dec.logits
    for i in range(max_new_tokens):
        nxt = pick(logits, temperature, top_k)
        yield nxt
        if i + 1 < max_new_tokens:
            logits = dec.step(nxt)
