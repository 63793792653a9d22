"""benchmarks/gpu_check.py, the script to run the first time a GPU is lent, run with --cpu (tiny sizes) so that it
cannot rot between loans: every training run records its updates (norm, loss scale, loss), fairseq-generate runs in
float32 and --fp16 over every question, the throughput part runs, and the JSON holds what the summary prints."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"


@pytest.mark.slow
def test_gpu_check_runs_end_to_end_on_the_cpu(tmp_path):
    out = tmp_path / "gpu_check.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--cpu", "--cache", str(tmp_path / "cache"), "--rounds", "1",
                           "--json-out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    report = json.loads(out.read_text())
    assert report["ok"] and report["device"] == "cpu" and report["sizes"] == "tiny"
    runs = {(r["family"], r["precision"]): r for r in report["training"]}
    assert set(runs) == {("rag_token", "fp32"), ("rag_token", "amp"), ("fid", "fp32"), ("fid", "amp")}
    for (family, precision), run in runs.items():
        updates = run["updates"]
        assert [u["num_updates"] for u in updates] == [1, 2, 3], (family, precision)
        assert all(u["update_norm"] > 0 and not u["skipped"] for u in updates)
        assert all(u["loss"] == u["loss"] and u["gnorm"] > 0 for u in updates)
        # without CUDA torch disables the GradScaler of fairseq's AMP wrapper: scale 1, the same updates as fp32
        assert all(u["loss_scale_after"] == (1.0 if precision == "amp" else None) for u in updates)
    for family in ("rag_token", "fid"):
        fp32 = [u["update_norm"] for u in runs[(family, "fp32")]["updates"]]
        amp = [u["update_norm"] for u in runs[(family, "amp")]["updates"]]
        assert amp == pytest.approx(fp32, rel=1e-5)
    generation = {g["family"]: g for g in report["generation"]}
    assert set(generation) == {"rag_token", "fid"}
    for g in generation.values():
        assert g["ok"] and g["questions"] == 64 and g["same_hypothesis_share"] >= 0.5
        assert g["fp32_sentences_per_s"] > 0 and g["fp16_sentences_per_s"] > 0
    speeds = report["throughput"]["questions_per_s"]
    assert speeds["rag_token_beam4"]["plugin"] > 0 and speeds["rag_sequence_beam4_thorough"]["plugin"] > 0
    assert "| rag_token --amp | 3 |" in proc.stdout


def test_gpu_check_without_a_gpu_or_cpu_flag_is_a_one_line_error(tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPT), "--cache", str(tmp_path)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("error: no CUDA device is visible to torch (fix: ")
    assert not any(tmp_path.iterdir())  # nothing built
