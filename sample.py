"""
Generate text from the teacher or from a student, streaming tokens as they come.

    python sample.py --prompt="The capital of France is"       # the teacher (--teacher=default)
    python sample.py --chat="Give me three tips for sleeping well."
    python sample.py --init_from=out/gated_deltanet/stage3.pt --chat="Hi!"   # a trained student
    python sample.py --mixer=gated_deltanet --prompt="Hello"   # untrained student from the teacher
    python sample.py --mixer=kda --backend=naive --max_new_tokens=8   # its textbook recurrence

--init_from=teacher (the default) runs --teacher, or with --mixer a new student built from it;
--init_from=<checkpoint> runs the checkpoint (and --mixer, when given, must be what it holds).
Teachers decode with a key/value cache; students carry their recurrent state (and short-conv
tail), so their memory does not grow with the length of the text. On a GPU the decoding step
runs on static caches from a CUDA graph (decode.py; --decoder=plain: decode.plain's loop).
"""

import codecs
import sys
import time
from dataclasses import dataclass

import torch

import checkpoint
import cli
import decode


@dataclass
class Settings(checkpoint.ModelSettings):  # the model's settings first: --init_from, --mixer, ...
    # --- what to generate ---
    prompt: str = "Once upon a time"  # plain-text prompt
    chat: str = ""  # a user message, wrapped in the ChatML template (then --prompt is not used)
    max_new_tokens: int = 128  # tokens to generate
    temperature: float = 0.8  # 0 = greedy
    top_k: int = 50  # sample among the top_k most likely tokens; 0 = no top-k filtering
    num_samples: int = 1  # samples drawn in one batch
    seed: int = 1337  # sampling, and an untrained student's new weights
    decoder: str = "auto"  # fast: static caches (decode.py), on CUDA compiled and replayed from a CUDA graph; plain: decode.plain's growing caches; auto: fast on CUDA, plain otherwise


RULES = [("max_new_tokens", lambda v: v >= 0, "an integer >= 0"), ("top_k", lambda v: v >= 0, "an integer >= 0"),
         ("temperature", lambda v: v >= 0, "a number >= 0 (0 = greedy)"),
         ("num_samples", lambda v: v >= 1, "an integer >= 1"),
         ("decoder", lambda v: v in decode.DECODERS, f"one of {', '.join(decode.DECODERS)}")]


def fail(msg):
    """A setting that cannot work: one line on stderr and status 2, before any model loads."""
    print(f"sample.py: error: {msg}", file=sys.stderr)
    raise SystemExit(2)


def settings(argv=None):
    """The run's Settings from the command line (--help lists them), checked."""
    s, _ = cli.settings(sys.argv[1:] if argv is None else argv, Settings, fail, checkpoint.GPU_DEFAULTS)
    checkpoint.check_settings(s, fail)
    cli.check(s, RULES, fail)
    if not s.chat and not s.prompt:  # no token to continue from
        fail("--prompt is empty: give some text to continue, or --chat=<a message>")
    return s


def main(argv=None):
    s = settings(argv)
    torch.manual_seed(s.seed)
    net, tok = checkpoint.load_from_settings(s)
    if s.chat:
        ids, _ = tok.encode_chat([{"role": "user", "content": s.chat}], add_generation_prompt=True)
        stops = {tok.im_end_id, tok.eot_id}
    else:
        ids, stops = tok.encode(s.prompt), {tok.eot_id}
    x = torch.tensor([ids] * s.num_samples, dtype=torch.long, device=s.device)  # (N, T)
    print(f"{net.config.mixer} model, {net.num_params() / 1e6:.1f}M parameters, prompt {len(ids)} tokens", file=sys.stderr)

    stream = s.num_samples == 1
    if stream:
        sys.stdout.write("" if s.chat else s.prompt)
        utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")  # tokens may split characters
    out = [[] for _ in range(s.num_samples)]
    done = torch.zeros(s.num_samples, dtype=torch.bool, device=s.device)
    stop_ids = torch.tensor(sorted(stops), device=s.device)
    opts = decode.options(s.decoder, s.device)  # static caches, CUDA graph, compiled blocks
    t0, n = time.time(), 0
    for nxt in decode.generate(net, x, s.max_new_tokens, s.temperature, s.top_k or None, **opts):
        n += 1
        for i, t in enumerate(nxt.tolist()):
            if not done[i]:
                out[i].append(t)
        done |= torch.isin(nxt, stop_ids)
        if stream and not done[0]:
            sys.stdout.write(utf8.decode(tok.decode_bytes(out[0][-1:])))
            sys.stdout.flush()
        if done.all():
            break
    dt = time.time() - t0
    if stream:
        print(utf8.decode(b"", final=True))
    else:
        for i, ids_i in enumerate(out):
            text = tok.decode([t for t in ids_i if t not in stops])
            print(f"--- sample {i + 1}\n{'' if s.chat else s.prompt}{text}")
    how = "static caches" + (", CUDA graph" if opts["graph"] else "") if opts["static"] else "plain"
    print(f"{n} steps x {s.num_samples} samples in {dt:.2f}s (prefill included): "
          f"{n * s.num_samples / max(dt, 1e-9):.1f} tokens/s ({s.device}, {s.dtype}, {how} decoding)",
          file=sys.stderr)


if __name__ == "__main__":
    main()
