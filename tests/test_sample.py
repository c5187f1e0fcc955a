"""sample.py end to end on the offline teacher."""

import os
import sys

import pytest
import torch

import checkpoint
import decode
import model as M
import sample

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts"))
import decode_speed  # noqa: E402


def test_greedy_chat_streams_the_models_own_greedy_answer(capsys, teacher, tok):
    sample.main(["--chat=What is the capital of France?", "--temperature=0", "--max_new_tokens=12", "--device=cpu", "--dtype=float32"])
    out, err = capsys.readouterr()
    ids, _ = tok.encode_chat([{"role": "user", "content": "What is the capital of France?"}], add_generation_prompt=True)
    greedy = []
    for t in decode.plain(teacher, torch.tensor([ids]), 12, temperature=0):
        if t.item() in (tok.im_end_id, tok.eot_id):
            break
        greedy.append(t.item())
    assert out.strip() == tok.decode(greedy).strip()
    assert "Paris" in out
    assert "tokens/s" in err


def test_several_samples_and_bad_arguments(capsys):
    sample.main(["--prompt=Hello", "--num_samples=2", "--max_new_tokens=4", "--device=cpu", "--dtype=float32"])
    out, _ = capsys.readouterr()
    assert out.count("--- sample") == 2
    with pytest.raises(SystemExit):
        sample.main(["--temperature=-1"])
    with pytest.raises(SystemExit, match="no such file"):
        sample.main(["--init_from=missing.gguf"])


def test_student_decodes_from_its_recurrent_state(capsys, teacher, tok):
    # an untrained gated_deltanet student built from the real teacher: greedy tokens streamed by
    # sample.py (chunked prefill, then one-token steps from the carried state) equal greedy
    # tokens recomputed by full forward passes over the whole growing sequence
    sample.main(["--mixer=gated_deltanet", "--prompt=The sky is", "--temperature=0", "--max_new_tokens=6",
                 "--device=cpu", "--dtype=float32"])
    out, err = capsys.readouterr()
    assert "gated_deltanet model" in err
    torch.manual_seed(sample.Settings.seed)  # the same new weights as sample.py's student
    student = checkpoint.student_from_teacher(teacher, "gated_deltanet").eval()
    ids = tok.encode("The sky is")
    with torch.no_grad():
        for _ in range(6):
            ids.append(int(student(torch.tensor([ids]))[0, -1].argmax()))
    assert out.rstrip("\n") == "The sky is" + tok.decode(ids[len(tok.encode("The sky is")):])


def test_decoding_caches_grow_for_the_teacher_and_not_for_students():
    # decode_speed.py's byte count: the teacher's cache holds k and v of every token read
    # (prompt, 2 warm-up steps, the timed steps); a student's holds its state and conv tail alone
    torch.manual_seed(0)
    cfg = M.Config(vocab_size=64, n_layer=2, n_embd=32, n_head=4, n_kv_head=2, intermediate_size=48)
    teacher = M.SmolLM2(cfg).eval()
    torch.manual_seed(sample.Settings.seed)  # the same new weights as sample.py's student
    student = checkpoint.student_from_teacher(teacher, "gated_deltanet").eval()
    B, D = 3, cfg.head_dim
    per_token = 2 * cfg.n_layer * B * cfg.n_kv_head * D * 4  # k and v, fp32
    assert decode_speed.measure(teacher, 16, B, steps=3)[2] == (16 + 2 + 3) * per_token
    assert decode_speed.measure(teacher, 48, B, steps=3)[2] == (48 + 2 + 3) * per_token
    state = cfg.n_layer * B * (cfg.n_head * D * D + (cfg.conv_size - 1) * 3 * cfg.n_head * D) * 4
    assert decode_speed.measure(student, 16, B, steps=3)[2] == state
    assert decode_speed.measure(student, 48, B, steps=3)[2] == state


def test_decode_speed_writes_its_table_and_plot(tmp_path, capsys):
    out = tmp_path / "d.md"
    rows = decode_speed.main(["--lengths=8,4", "--steps=1", "--rounds=2", "--mixers=linear_attention,swa",
                              "--device=cpu", "--dtype=float32", f"--out={out}"])
    assert [(r[0], r[1]) for r in rows] == [(n, L) for n in ("teacher (attention)", "linear_attention", "swa")
                                            for L in (4, 8)]
    assert out.read_text().count("\n| ") == 1 + 6 and (tmp_path / "decode_speed.png").stat().st_size > 0
    with pytest.raises(SystemExit):
        decode_speed.main(["--mixers=softmax"])
    assert "unknown mixer 'softmax'" in capsys.readouterr().err
