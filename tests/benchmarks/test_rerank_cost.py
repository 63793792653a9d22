"""benchmarks/rerank_cost.py's own logic: the peak-memory measurement (VmHWM reset to the current RSS, so an earlier
peak of the process does not hide or inflate a pass's rise) and the report's tables (the demo's training estimate)."""
import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]


def _script():
    spec = importlib.util.spec_from_file_location("rerank_cost", ROOT / "benchmarks" / "rerank_cost.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_peak_rise_is_the_pass_own_after_a_larger_earlier_peak():
    rc = _script()
    earlier = np.ones(200 * 2 ** 20, dtype=np.uint8)  # an earlier peak 200 MiB above what the pass needs
    del earlier
    assert rc._reset_peak(), "/proc/self/clear_refs refused the reset"
    before = rc._status_kib("VmRSS")
    block = np.ones(64 * 2 ** 20, dtype=np.uint8)  # touched: resident
    rise = (rc._status_kib("VmHWM") - before) / 1024
    del block
    assert 60 <= rise <= 90, rise


def _timing(ms, load=2.0):
    return {"ms_per_question": ms, "load": load}


def test_report_tables_and_the_training_estimate():
    rc = _script()
    result = {
        "settings": {"candidates": [10, 20], "memory_candidates": 20, "n_docs": 3},
        "demo": {"updates": 400, "batch": 32},
        "time": {"first": {"select": {"10": _timing(5.0), "20": _timing(5.5)},
                           "search": {"10": _timing(1.0), "20": _timing(1.25)}},
                 "maxsim_cache": {"skipped": "no cache"},
                 "upr": {"select": {"10": _timing(40.0, 3.5), "20": _timing(80.0)}, "train": _timing(150.0)}},
        "memory": {"upr": {"questions": 32, "peak_rise_mib": 96.0, "peak_rise_mib_per_question": 3.0, "load": 2.5},
                   "maxsim_cache": {"skipped": "no cache"}},
        "states": {"passages": 10, "hidden": 4, "tokens_from": "x", "tokens_mean": 5.0, "tokens_p95": 7.0,
                   "tokens_max": 8, "kb_mean": 0.1, "kb_p95": 0.1, "kb_max": 0.1, "states_gb": 0.0, "disk_gb": None,
                   "lru_size": 1024, "lru_mb_mean": 0.1, "lru_mb_largest": 0.1}}
    lines = rc.report(result).splitlines()
    upr = next(x for x in lines if x.startswith("| upr | 40.0"))
    assert upr == "| upr | 40.0 (3.5) | 80.0 (2.0) | 150.0 (2.0) | 32.0 min |"  # 150 ms x 400 x 32 = 32 min
    assert "| first stage: MIPS alone | 1.0 (2.0) | 1.2 (2.0) | | |" in lines
    assert any(x.startswith("| maxsim, `--maxsim-cache` | skipped: no cache") for x in lines)
    assert "| upr | 96.0 | 3.00 | 2.5 |" in lines
    assert any("no cache" in x and x.startswith("| 5.0 / 7 / 8") for x in lines)
