"""Finished-run markers (rag_plugin/pipeline/markers.py): a run is finished only with its checkpoint and the same
settings; a run finished otherwise is removed before it runs again, an unfinished one kept (fairseq continues it)."""
from rag_plugin.pipeline import markers


def test_finished_needs_the_checkpoint_and_the_same_settings(tmp_path):
    run = tmp_path / "run"
    settings = {"updates": 400, "arch": "rag_token_tiny"}
    markers.mark_finished(run, settings)
    assert markers.read_marker(run) == settings and not markers.is_finished(run, settings)  # no checkpoint
    (run / "checkpoint_last.pt").write_bytes(b"x")
    assert markers.is_finished(run, settings)
    assert not markers.is_finished(run, {**settings, "updates": 500})
    (run / markers.MARKER).write_text("{not json")
    assert markers.read_marker(run) is None and not markers.is_finished(run, settings)


def test_prepare_removes_a_run_finished_otherwise_and_keeps_an_unfinished_one(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "checkpoint_last.pt").write_bytes(b"x")
    markers.prepare(run, {"updates": 400})  # unfinished: fairseq continues from its checkpoint
    assert (run / "checkpoint_last.pt").is_file()
    markers.mark_finished(run, {"updates": 400})
    markers.prepare(run, {"updates": 400})  # the same settings: kept (the caller skips it)
    assert (run / "checkpoint_last.pt").is_file()
    markers.prepare(run, {"updates": 500})  # finished with other settings: started over
    assert not run.exists()
    run.mkdir()
    (run / "checkpoint_last.pt").write_bytes(b"x")
    markers.prepare(run, {"updates": 500}, start_over=True)
    assert not run.exists()
