"""scripts/run_demo.py's bookkeeping: a resumed run still reports what every step cost."""
import importlib.util
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("run_demo", ROOT / "scripts" / "run_demo.py")
run_demo = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(run_demo)


def _demo(work: Path):
    return run_demo.Demo(work, updates=1, jeopardy_updates=1, sweep=[1], log=lambda m: None)


def test_step_time_is_kept_from_the_invocation_that_did_the_work(tmp_path):
    demo = _demo(tmp_path)
    with demo.step("train x"):
        demo.run([sys.executable, "-c", "import time; time.sleep(0.3)"])
    kept = json.loads((tmp_path / "step_timings.json").read_text())
    assert kept["train x"] >= 0.3

    again = _demo(tmp_path)  # a rerun: the step's outputs exist, it runs nothing
    with again.step("train x"):
        pass
    assert again.timings["train x"] < 0.3
    assert json.loads((tmp_path / "step_timings.json").read_text()) == kept

    with again.step("generate y"):
        again.run([sys.executable, "-c", "pass"])
    assert set(json.loads((tmp_path / "step_timings.json").read_text())) == {"train x", "generate y"}


def test_results_markdown_lists_this_invocation_and_every_step():
    results = {"systems": {"closed_book": {"test_em": 3.0, "test_f1": 6.0}},
               "timings_s": {"generate y": 5.0}, "total_s": 60.0,
               "step_timings_when_run_s": {"train x": 600.0, "generate y": 5.0}, "all_steps_s": 605.0,
               "command": "make demo", "date": "2026-12-01 00:00 UTC", "machine": "2 CPU cores"}
    text = run_demo._results_markdown(results, ROOT / "runs" / "demo")
    assert "1.0 minutes for this invocation" in text
    assert "10.1 minutes for all the steps" in text
    assert "Step timings of this invocation (s): generate y: 5" in text
    assert "last did its work (s): train x: 600, generate y: 5" in text
