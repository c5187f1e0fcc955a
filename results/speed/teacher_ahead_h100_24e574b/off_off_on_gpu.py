"""Two runs with the teacher's pass in line and one with it ahead, on a GPU, at the settings of
tests/test_train.py::test_the_teacher_pass_issued_ahead_changes_no_number: how far two runs in line
differ against how far the run ahead differs. Run from the project's root:
python results/speed/teacher_ahead_h100_24e574b/off_off_on_gpu.py"""

import pathlib
import sys
import tempfile

sys.path[:0] = [".", "tests"]
import checkpoint  # noqa: E402
import test_train as T  # noqa: E402
import train  # noqa: E402

root = pathlib.Path(tempfile.mkdtemp())
checkpoint.save(str(root / "teacher.pt"), T.tiny_teacher())
T.write_corpus(str(root / "data"))
for stage in ("2", "3"):
    res = []
    for i, on in enumerate((False, False, True)):
        h = train.main(T.args(root, out_dir=root / f"{stage}{i}", stage=stage, init_from="teacher",
                              max_iters=6, eval_interval=3, grad_accum=2, long_block_size=64,
                              long_frac=0.5, teacher_ahead=on, device="cuda", dtype="bfloat16"))
        res.append([loss for _, loss in h["train"]] + [v["loss"] for v in h["val"]])
    for name, r in (("off", res[1]), ("on", res[2])):
        rel = max(abs(a - b) / abs(b) for a, b in zip(r, res[0]))
        print(f"stage {stage} off vs {name}: max rel diff", rel, "first equal", r[0] == res[0][0],
              flush=True)
