"""
The corpora (data/<name>/prepare.py writes them; data/README.md lists them) and Data, the reader
of their token files that train.py samples batches from.
"""

import os

import numpy as np
import torch


def need(path):
    """A FileNotFoundError that names the command building a missing data file."""
    if not os.path.exists(path):
        prep = os.path.join(os.path.dirname(path), "prepare.py")
        how = f"build it with: python {os.path.relpath(prep)}" if os.path.exists(prep) else \
            "expected uint16 token files train.bin and val.bin (chat: and uint8 train_mask.bin, val_mask.bin)"
        raise FileNotFoundError(f"{path} not found; {how}")


def read_tokens(path, vocab_size=None):
    """The uint16 token ids of a .bin file, memory-mapped, after checking the file: it exists,
    its size is even and not zero, and (given vocab_size) every id is inside the vocabulary."""
    need(path)
    size = os.path.getsize(path)
    if size == 0 or size % 2:
        raise ValueError(f"{path}: {size} bytes, not a file of uint16 tokens (empty or of odd size: cut short, "
                         f"or another format); rebuild it with its prepare.py")
    tokens = np.memmap(path, dtype=np.uint16, mode="r")
    if vocab_size is not None and int(tokens.max()) >= vocab_size:
        raise ValueError(f"{path}: token id {int(tokens.max())} is outside the model's vocabulary ({vocab_size}): "
                         f"made with another tokenizer?")
    return tokens


class Data:
    """Windows of block_size + 1 tokens from <data_dir>/<split>.bin.

    Text windows start anywhere; chat windows start at a conversation (after an
    <|endoftext|>, id 0) and their targets are -1 (no loss) wherever <split>_mask.bin is 0.
    """

    def __init__(self, data_dir, split, block_size, chat):
        self.path, self.T, self.chat = os.path.join(data_dir, f"{split}.bin"), block_size, chat
        self.mask_path = os.path.join(data_dir, f"{split}_mask.bin")
        tokens = read_tokens(self.path)
        if chat:
            need(self.mask_path)
            if os.path.getsize(self.mask_path) != len(tokens):
                raise ValueError(f"{self.mask_path}: {os.path.getsize(self.mask_path)} mask bytes for {len(tokens)} "
                                 f"tokens in {self.path}; the two must match: rebuild them together")
        if len(tokens) <= block_size + 1:
            raise ValueError(f"{self.path}: {len(tokens)} tokens, fewer than one window of --block_size={block_size}")
        self.max_id = int(tokens.max())  # checked against the vocabulary once the model is loaded
        last = len(tokens) - block_size - 1  # the last position a window may start at
        self.starts = None  # text: window i starts at token i, for i in [0, n)
        self.n = last + 1
        if chat:  # window i starts at conversation i, of those that leave room for a whole window
            starts = np.concatenate([[0], np.flatnonzero(np.asarray(tokens) == 0) + 1])
            self.starts = starts[starts <= last]
            self.n = len(self.starts)

    def get(self, ix, device):
        """x, y [len(ix), T] int64: windows number ix (see __init__), inputs and next tokens."""
        tokens = np.memmap(self.path, dtype=np.uint16, mode="r")  # reopened each time (nanoGPT: avoids a leak)
        pos = ix if self.starts is None else self.starts[ix]
        x = torch.from_numpy(np.stack([tokens[i:i + self.T] for i in pos]).astype(np.int64))  # (B, T)
        y = torch.from_numpy(np.stack([tokens[i + 1:i + 1 + self.T] for i in pos]).astype(np.int64))
        if self.chat:  # loss only where the mask says so (the assistant's tokens)
            mask = np.memmap(self.mask_path, dtype=np.uint8, mode="r")
            keep = torch.from_numpy(np.stack([mask[i + 1:i + 1 + self.T] for i in pos]).astype(bool))
            y = y.masked_fill(~keep, -1)
        if torch.device(device).type == "cuda":
            # from pinned memory, without waiting: a copy from pageable memory first waits for
            # every kernel queued on the stream, and the host could not issue ahead of the device
            return (x.pin_memory().to(device, non_blocking=True),
                    y.pin_memory().to(device, non_blocking=True))
        return x.to(device), y.to(device)

    def sample(self, B, seed, step, part, device):
        """Part `part` of step `step`'s batch (part = micro-step * GPUs + rank): a pure function
        of its coordinates, so a resumed run draws exactly the batches the interrupted one would
        have, and a step's batch is the same however it is split over GPUs and micro-steps."""
        rng = np.random.default_rng([seed, step, part])
        return self.get(rng.integers(0, self.n, size=B), device)

    def fixed(self, n, B, device):
        """n batches of evenly spaced windows: the same val set at every eval."""
        ix = np.linspace(0, self.n - 1, n * B).astype(np.int64)
        return [self.get(ix[i * B:(i + 1) * B], device) for i in range(n)]
