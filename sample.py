"""
Generate text from the teacher or from a student, streaming tokens as they come.

    python sample.py --prompt="The capital of France is"
    python sample.py --chat="Give me three tips for sleeping well."
    python sample.py --init_from=out/gated_deltanet/stage3.pt --chat="Hi!"
    python sample.py --mixer=gated_deltanet --prompt="Hello"   # untrained student from the teacher
    python sample.py --mixer=kda --backend=naive --max_new_tokens=8   # its textbook recurrence

Teachers decode with a key/value cache; students carry their recurrent state (and short-conv
tail), so their memory does not grow with the length of the text. On a GPU the decoding step
runs on static caches from a CUDA graph (decode.py; --decoder=plain: decode.plain's loop).
"""

import argparse
import codecs
import sys
import time

import torch

import checkpoint
import decode


def get_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    checkpoint.add_args(p)  # --init_from, --tokenizer, --mixer, --device, --dtype, --backend
    p.add_argument("--prompt", default="Once upon a time", help="plain-text prompt")
    p.add_argument("--chat", default=None, help="a user message, wrapped in the ChatML template")
    p.add_argument("--max_new_tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.8, help="0 = greedy")
    p.add_argument("--top_k", type=int, default=50, help="0 = no top-k filtering")
    p.add_argument("--num_samples", type=int, default=1, help="samples drawn in one batch")
    p.add_argument("--seed", type=int, default=1337)
    decode.add_args(p)
    args = p.parse_args(argv)
    if args.temperature < 0 or args.max_new_tokens < 0 or args.num_samples < 1 or args.top_k < 0:
        p.error("temperature, max_new_tokens and top_k must be >= 0, num_samples >= 1")
    if args.chat is None and not args.prompt:  # no token to continue from
        p.error("--prompt is empty: give some text to continue, or --chat=<a message>")
    return args


def main(argv=None):
    args = get_args(argv)
    torch.manual_seed(args.seed)
    net, tok = checkpoint.load_from_args(args)
    if args.chat is not None:
        ids, _ = tok.encode_chat([{"role": "user", "content": args.chat}], add_generation_prompt=True)
        stops = {tok.im_end_id, tok.eot_id}
    else:
        ids, stops = tok.encode(args.prompt), {tok.eot_id}
    x = torch.tensor([ids] * args.num_samples, dtype=torch.long, device=args.device)  # (N, T)
    print(f"{net.config.mixer} model, {net.num_params() / 1e6:.1f}M parameters, prompt {len(ids)} tokens", file=sys.stderr)

    stream = args.num_samples == 1
    if stream:
        sys.stdout.write(args.prompt if args.chat is None else "")
        utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")  # tokens may split characters
    out = [[] for _ in range(args.num_samples)]
    done = torch.zeros(args.num_samples, dtype=torch.bool, device=args.device)
    stop_ids = torch.tensor(sorted(stops), device=args.device)
    opts = decode.options(args.decoder, args.device)  # static caches, CUDA graph, compiled blocks
    t0, n = time.time(), 0
    for nxt in decode.generate(net, x, args.max_new_tokens, args.temperature, args.top_k or None, **opts):
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
            print(f"--- sample {i + 1}\n{args.prompt if args.chat is None else ''}{text}")
    how = "static caches" + (", CUDA graph" if opts["graph"] else "") if opts["static"] else "plain"
    print(f"{n} steps x {args.num_samples} samples in {dt:.2f}s (prefill included): "
          f"{n * args.num_samples / max(dt, 1e-9):.1f} tokens/s ({args.device}, {args.dtype}, {how} decoding)",
          file=sys.stderr)


if __name__ == "__main__":
    main()
