"""A run never loses good work, and bad input stops with one clear line before the long work:
the non-finite guard of the training loop (never a non-finite checkpoint over a finite one) and
its warning on a climbing loss; checkpoints on a full disk; the GGUF cache on a failing disk;
range-checked settings; token files, chat masks, output folders and checkpoints checked when a
run starts; and the other inputs users got tracebacks from."""

import hashlib
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import checkpoint
import train
from data import Data, read_tokens
from test_train import MIXER, args, one_thread, setup, tiny_teacher, write_corpus  # noqa: F401 (fixtures)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CUDA = torch.cuda.is_available()


def stops(argv):
    """train.main's one-line message (it exits through SystemExit with a string)."""
    with pytest.raises(SystemExit) as e:
        train.main(argv)
    msg = e.value.code
    assert isinstance(msg, str) and msg.startswith("train.py: ") and "\n" not in msg.strip(), msg
    return msg


def digest(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


# --- the non-finite guard ---------------------------------------------------------------------


def test_a_diverging_run_stops_at_its_first_bad_step_and_keeps_the_finite_checkpoint(setup, tmp_path):
    out = tmp_path / "out"
    train.main(args(setup, stage="1", out_dir=out, max_iters=4, eval_interval=4))
    ckpt = out / MIXER / "stage1.pt"
    good = digest(ckpt)
    # resumed with a rate that blows the weights up: the first non-finite step is named, the run
    # stops, and the checkpoint of step 4 is untouched and still loads
    msg = stops(args(setup, stage="1", out_dir=out, max_iters=12, eval_interval=4, learning_rate=1e9))
    assert "step 6: the loss or the gradient norm is not finite" in msg, msg
    assert f"{ckpt} keeps the weights of step 4" in msg and "--learning_rate" in msg
    assert digest(ckpt) == good and not os.path.exists(str(ckpt) + ".tmp")
    assert torch.isfinite(torch.cat([p.flatten() for p in checkpoint.load(str(ckpt)).parameters()])).all()
    # from scratch: no checkpoint is ever written
    msg = stops(args(setup, stage="1", out_dir=tmp_path / "fresh", learning_rate=1e9))
    assert "step 2: " in msg and "no checkpoint was written" in msg, msg
    assert not os.path.exists(tmp_path / "fresh" / MIXER / "stage1.pt")
    # without clipping the gradient norm is still watched, and clipping is suggested
    msg = stops(args(setup, stage="1", out_dir=tmp_path / "unclipped", learning_rate=1e9, grad_clip=0))
    assert "step 2: " in msg and "or clip with --grad_clip=1" in msg, msg


def test_a_climbing_loss_is_warned_of_once(setup, tmp_path, capsys):
    train.main(args(setup, stage="1", out_dir=tmp_path, learning_rate=1.0))  # 1.3 -> ~3000 at step 2
    out = capsys.readouterr().out
    assert out.count("warning: the loss rose from") == 1 and "may be too high" in out


def test_a_diverged_checkpoint_is_refused_wherever_it_is_read(setup, tmp_path):
    net = tiny_teacher()
    with torch.no_grad():
        net.model.layers[1].mlp.up_proj.weight[0, 0] = float("nan")
    path = str(tmp_path / "nan.pt")
    checkpoint.save(path, net)
    with pytest.raises(ValueError, match=r"not finite \(model.layers.1.mlp.up_proj.weight, ...\): the run that wrote it diverged"):
        checkpoint.load(path)
    msg = stops(args(setup, stage="2", init_from=path, out_dir=tmp_path / "out"))
    assert "not finite" in msg
    r = subprocess.run([sys.executable, "sample.py", f"--init_from={path}", "--device=cpu", "--max_new_tokens=2"],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 1 and r.stderr.startswith("error: ") and r.stderr.count("\n") == 1, r.stderr


# --- disks --------------------------------------------------------------------------------------


def test_a_checkpoint_that_does_not_fit_is_refused_before_writing(tmp_path, monkeypatch):
    monkeypatch.setattr(checkpoint.shutil, "disk_usage", lambda p: type("U", (), {"free": 1000})())
    with pytest.raises(OSError, match=r"needs about .* GiB free; make room or write elsewhere"):
        checkpoint.save(str(tmp_path / "a.pt"), tiny_teacher())
    assert os.listdir(tmp_path) == []


def test_a_failed_write_removes_its_partial_file_and_keeps_the_old_checkpoint(tmp_path, monkeypatch):
    path = str(tmp_path / "a.pt")
    checkpoint.save(path, tiny_teacher())
    good = digest(path)

    def full_disk(obj, f):  # writes part of the file, then fails as torch's zip writer does
        open(f, "wb").write(b"PK" + b"\0" * 1000)
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 64 vs 0")

    monkeypatch.setattr(checkpoint.torch, "save", full_disk)
    with pytest.raises(OSError, match="could not write the checkpoint.*partial file is removed"):
        checkpoint.save(path, tiny_teacher())
    assert os.listdir(tmp_path) == ["a.pt"] and digest(path) == good


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU"))])
def test_a_background_write_keeps_the_state_of_its_call_and_its_error_comes_out_at_wait(tmp_path, monkeypatch,
                                                                                         device):
    model, history = tiny_teacher().to(device), {"train": [(1, 2.0)]}
    if device == "cuda":  # a GPU's state goes to pinned host memory, where copies run at full rate
        assert all(t.is_pinned() for t in checkpoint._host_copy(dict(model.state_dict())).values())
    path, fore = str(tmp_path / "a.pt"), str(tmp_path / "b.pt")
    checkpoint.save(fore, model, history=history)
    checkpoint.save(path, model, background=True, history=history)
    with torch.no_grad():  # the loop goes on while the thread writes: none of it may reach the file
        for p in model.parameters():
            p.add_(1.0)
    history["train"].append((2, 1.0))
    checkpoint.wait()
    # read as checkpoint.load reads them: a foreground save keeps the GPU tensors' device, a background one is on the host
    a, b = (torch.load(f, map_location="cpu", weights_only=True) for f in (path, fore))
    assert a["history"] == {"train": [(1, 2.0)]} == b["history"]
    assert a["model"].keys() == b["model"].keys()
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    good = digest(path)

    def full_disk(obj, f):
        open(f, "wb").write(b"PK" + b"\0" * 1000)
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 64 vs 0")

    monkeypatch.setattr(checkpoint.torch, "save", full_disk)
    checkpoint.save(path, model, background=True)  # returns; the thread fails
    with pytest.raises(OSError, match="could not write the checkpoint.*partial file is removed"):
        checkpoint.wait()
    checkpoint.wait()  # reported once
    assert sorted(os.listdir(tmp_path)) == ["a.pt", "b.pt"] and digest(path) == good


def test_work_behind_the_writes_runs_after_them_and_its_error_comes_out_at_wait(tmp_path):
    # train.py's plot on a GPU: drawn by the writing thread, after the checkpoint queued before it
    path, seen = str(tmp_path / "a.pt"), []
    checkpoint.save(path, tiny_teacher(), background=True)
    checkpoint.behind(lambda: seen.append(os.path.exists(path)))
    checkpoint.wait()
    assert seen == [True]

    def fails():
        raise ValueError("no plot")

    checkpoint.behind(fails)
    with pytest.raises(ValueError, match="no plot"):
        checkpoint.wait()


def test_a_process_stopped_while_a_checkpoint_is_written_writes_it_whole_first(tmp_path):
    # a stopped run (Ctrl-C, or reproduce.py's SIGTERM) unwinds and exits: the write in flight ends
    code = ("import sys, torch; sys.path.insert(0, sys.argv[1]); import checkpoint, model as M\n"
            "m = M.SmolLM2(M.Config(vocab_size=64, n_layer=2, n_embd=32, n_head=4, n_kv_head=2, "
            "intermediate_size=64, max_seq_len=64))\n"
            "checkpoint.save(sys.argv[2], m, background=True, big=torch.ones(2**25))\n"
            "raise KeyboardInterrupt")
    path = str(tmp_path / "a.pt")
    r = subprocess.run([sys.executable, "-c", code, ROOT, path], capture_output=True, text=True)
    assert r.returncode == -2 and "KeyboardInterrupt" in r.stderr, r.stderr  # exits by SIGINT, as Python does
    assert os.listdir(tmp_path) == ["a.pt"]
    assert torch.equal(torch.load(path, weights_only=True)["big"], torch.ones(2**25))


def test_a_failing_cache_disk_does_not_stop_loading_the_gguf(tmp_path, monkeypatch, capsys):
    import safetensors.torch

    try:
        gguf = checkpoint.default_gguf_path()
    except FileNotFoundError:
        pytest.skip("the offline teacher is not installed")

    def full(state, path, *a, **k):
        open(path, "wb").write(b"\0" * 100)
        raise safetensors.SafetensorError("No space left on device (os error 28)")

    monkeypatch.setattr(checkpoint, "CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(safetensors.torch, "save_file", full)
    config, state = checkpoint.read(gguf)
    assert config.n_layer == 30 and "model.embed_tokens.weight" in state
    assert "could not cache the converted weights" in capsys.readouterr().err
    assert not [f for root, _, files in os.walk(tmp_path) for f in files]  # no partial file left


# --- settings and files --------------------------------------------------------------------------


@pytest.mark.parametrize("key, value", [
    ("block_size", 0), ("block_size", -5), ("batch_size", 0), ("batch_size", -1), ("grad_accum", 0),
    ("eval_interval", 0), ("log_interval", 0), ("eval_iters", 0), ("max_iters", -1), ("learning_rate", -1e-3),
    ("warmup_frac", 1.5), ("beta2", 1.0), ("temperature", 0.0), ("grad_clip", -1.0), ("ce_weight", -1.0),
])
def test_settings_out_of_range_stop_before_any_work(setup, tmp_path, key, value):
    msg = stops(args(setup, stage="1", out_dir=tmp_path, **{key: value}))
    assert f"--{key}={value!r}: expected" in msg
    assert not os.path.exists(tmp_path / MIXER)  # nothing written, nothing loaded


@pytest.mark.skipif(CUDA, reason="this machine has a GPU")
def test_cuda_without_a_gpu_is_one_line_in_every_script(setup, tmp_path):
    assert "--device=cuda: no CUDA GPU here" in stops(args(setup, device="cuda", out_dir=tmp_path))
    extra = {"sample.py": ["--max_new_tokens=1"], "niah.py": ["--tasks=s_niah_1", f"--out_dir={tmp_path / 'n'}"],
             "evaluate.py": ["--tasks=", f"--data={setup / 'data' / 'val.bin'}"]}
    for script, more in extra.items():
        r = subprocess.run([sys.executable, script, "--device=cuda", *more], cwd=ROOT, capture_output=True, text=True)
        assert r.returncode == 1 and r.stderr.startswith("error: --device=cuda: no CUDA GPU here"), (script, r.stderr)


def write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    open(path, "wb").write(data)


@pytest.mark.parametrize("case", ["odd", "empty", "mask"])
def test_token_files_and_masks_are_checked_when_a_run_starts(setup, tmp_path, case):
    d = str(tmp_path / "data")
    write_corpus(d)
    if case == "odd":
        write(os.path.join(d, "train.bin"), open(os.path.join(d, "train.bin"), "rb").read()[:-1])
    elif case == "empty":
        write(os.path.join(d, "val.bin"), b"")
    else:
        write(os.path.join(d, "train_mask.bin"), open(os.path.join(d, "train_mask.bin"), "rb").read()[:-10])
    stage = "sft" if case == "mask" else "1"
    init = {"init_from": setup / "teacher.pt"} if stage == "sft" else {}
    msg = stops(args(setup, stage=stage, data_dir=d, out_dir=tmp_path / "out", mixer="attention", **init))
    says = {"odd": "bytes, not a file of uint16 tokens", "empty": "0 bytes, not a file of uint16 tokens",
            "mask": "mask bytes for"}[case]
    assert says in msg, msg


def test_ids_outside_the_vocabulary_are_named(tmp_path):
    path = str(tmp_path / "val.bin")
    np.array([1, 2, 60000], np.uint16).tofile(path)
    with pytest.raises(ValueError, match="token id 60000 is outside the model's vocabulary"):
        read_tokens(path, vocab_size=49152)
    assert list(read_tokens(path)) == [1, 2, 60000]


def test_an_output_folder_that_cannot_be_written_is_found_first(setup, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")  # a file where a folder should be
    assert "cannot write" in stops(args(setup, stage="1", out_dir=blocker / "out"))
    r = subprocess.run([sys.executable, "niah.py", "--tasks=s_niah_1", f"--out_dir={blocker / 'n'}", "--device=cpu"],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 1 and r.stderr.startswith("error: --out_dir=") and "cannot write" in r.stderr, r.stderr
    r = subprocess.run([sys.executable, "evaluate.py", f"--out={blocker / 'e' / 'r.json'}", "--device=cpu",
                        f"--data={setup / 'data' / 'val.bin'}", "--tasks="], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 1 and r.stderr.startswith("error: --out=") and "cannot write" in r.stderr, r.stderr


def test_a_corrupt_checkpoint_to_resume_names_the_file_and_the_way_out(setup, tmp_path):
    write(str(tmp_path / MIXER / "stage1.pt"), b"PK\x03\x04 not really a zip")
    msg = stops(args(setup, stage="1", out_dir=tmp_path))
    assert f"{tmp_path / MIXER / 'stage1.pt'}: cannot resume from it" in msg and "--resume=false" in msg


def test_a_student_is_not_a_teacher(setup, tmp_path):
    path = str(tmp_path / "student.pt")
    checkpoint.save(path, checkpoint.student_from_teacher(tiny_teacher(), MIXER))
    msg = stops(args(setup, stage="1", teacher=path, out_dir=tmp_path / "out"))
    assert f"--teacher={path} holds a {MIXER} student" in msg
    r = subprocess.run([sys.executable, "evaluate.py", f"--init_from={path}", f"--teacher={path}", "--tasks=",
                        f"--data={setup / 'data' / 'val.bin'}", "--device=cpu", "--dtype=float32"],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 1 and r.stderr.startswith(f"error: --teacher={path} holds a {MIXER} student"), r.stderr
    assert r.stderr.count("\n") == 1, r.stderr


def test_an_empty_prompt_is_refused_before_the_model_loads():
    r = subprocess.run([sys.executable, "sample.py", "--prompt=", "--init_from=missing.gguf"], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 2 and "--prompt is empty" in r.stderr and "no such file" not in r.stderr


def test_data_reader_refuses_a_longer_mask_too(tmp_path):
    d = str(tmp_path)
    write_corpus(d)
    write(os.path.join(d, "val_mask.bin"), open(os.path.join(d, "val_mask.bin"), "rb").read() + b"\1\1")
    with pytest.raises(ValueError, match="mask bytes for"):
        Data(d, "val", 32, chat=True)


@pytest.mark.parametrize("script, bad, says", [
    ("data/offline/prepare.py", "--val_fraction=2", "expected a fraction between 0 and 1"),
    ("data/fineweb_edu/prepare.py", "--max_tokens=-5", "expected an integer >= 0"),
    ("scripts/step_parts.py", "--T=0", "expected integers >= 1"),
    ("scripts/launch_sweep.py", "--set=_CONV_WARPS=0", "expected NAME=integers >= 1"),
    ("scripts/launch_sweep.py", "--set=_CONV_ROWS=32", "is not an integer launch constant"),
    ("scripts/launch_sweep.py", "--V=0", "--V: expected integers >= 1"),
    ("scripts/train_speed.py", "--trees=.,tests", "tests holds no train.py"),
    ("scripts/train_speed.py", "--mixer=attention", "a copy of the teacher has none"),
    ("scripts/train_speed.py", "--rounds=0", "--rounds=0: expected an integer >= 1"),
    ("scripts/profile_parts.py", "nosuch_profile.txt", "nosuch_profile.txt: no such file"),
])
def test_the_other_scripts_check_their_numbers(script, bad, says):
    r = subprocess.run([sys.executable, script, bad], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 2 and says in r.stderr and "Traceback" not in r.stderr, r.stderr
