"""sample.py end to end on the offline teacher."""

import pytest
import torch

import sample


def test_greedy_chat_streams_the_models_own_greedy_answer(capsys, teacher, tok):
    sample.main(["--chat=What is the capital of France?", "--temperature=0", "--max_new_tokens=12", "--device=cpu", "--dtype=float32"])
    out, err = capsys.readouterr()
    ids, _ = tok.encode_chat([{"role": "user", "content": "What is the capital of France?"}], add_generation_prompt=True)
    greedy = []
    for t in teacher.generate(torch.tensor([ids]), 12, temperature=0):
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
    import mixers

    sample.main(["--mixer=gated_deltanet", "--prompt=The sky is", "--temperature=0", "--max_new_tokens=6",
                 "--device=cpu", "--dtype=float32"])
    out, err = capsys.readouterr()
    assert "gated_deltanet model" in err
    student = mixers.student_from_teacher(teacher, "gated_deltanet").eval()
    ids = tok.encode("The sky is")
    with torch.no_grad():
        for _ in range(6):
            ids.append(int(student(torch.tensor([ids]))[0, -1].argmax()))
    assert out.rstrip("\n") == "The sky is" + tok.decode(ids[len(tok.encode("The sky is")):])
