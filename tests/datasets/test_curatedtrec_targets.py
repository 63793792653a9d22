"""CuratedTrec training targets: pattern expansion, the most frequent retrieved match,
rag-curatedtrec-targets on a tiny knowledge source, and the task's refusal of raw patterns."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from rag_plugin.datasets.curatedtrec import (
    derive_targets,
    expand_pattern,
    match_counts,
    most_frequent_match,
    rewrite_record,
)
from rag_plugin.util.errors import UserError

ROOT = Path(__file__).resolve().parents[2]
CURATEDTREC_TARGETS = str(Path(sys.executable).parent / "rag-curatedtrec-targets")  # as installed
FLINT = r"Charles\s+Flint|Flint"


# ------------------------------------------------------------------------------------ expansion
@pytest.mark.parametrize("pattern,expected", [
    (r"194[45]", ["1944", "1945"]),                     # a class of listed characters is an alternation
    (FLINT, ["Charles Flint", "Flint"]),                # \s+ (unbounded) -> a space
    (r"(the )?Beatles", ["the Beatles", "Beatles"]),    # optional part both ways, greedy first
    (r"colou?r", ["colour", "color"]),
    (r"^(?:Mr\.? )?Smith$", ["Mr. Smith", "Mr Smith", "Smith"]),  # anchors vanish
    (r"\d+ miles", ["miles"]),                          # non-deterministic -> space, collapsed, stripped
    (r"\d+", []),                                       # nothing literal at all
    (r"Smith (born", ["Smith (born"]),                  # does not compile: stands for itself
])
def test_expand_pattern_hand_computed(pattern, expected):
    assert expand_pattern(pattern) == expected


def test_expand_pattern_is_capped():
    assert len(expand_pattern("[ab][cd][ef][gh][ij][kl][mn]")) == 64  # 128 combinations
    assert expand_pattern("(a|b|c)(d|e)", cap=3) == ["ad", "ae", "bd"]


# ------------------------------------------------------------------------------------ matching
def test_most_frequent_match_counts_case_insensitively():
    texts = ["IBM: Flint merged four companies.", "Charles Flint founded it.", "charles  flint, trust king",
             "Flint was born in Maine."]
    assert match_counts([FLINT], texts) == [("Flint", 2), ("Charles Flint", 2)]
    assert most_frequent_match([FLINT], texts[1:]) == "Charles Flint"  # 2 against 1
    # a tie goes to the match seen first in rank order
    assert most_frequent_match([FLINT], texts) == "Flint"
    assert most_frequent_match([r"194[45]"], ["in 1944 and 1945", "1945 again"]) == "1945"
    assert most_frequent_match([r"194[45]"], ["nothing here"]) is None


def test_rewrite_record_keeps_pattern_and_provenance():
    obj = {"id": "x", "input": "q", "output": [{"answer": FLINT, "provenance": [{"id": "p1"}]}],
           "meta": {"answer_is_regex": True, "extra": 1}}
    new = rewrite_record(obj, [FLINT], ["Charles Flint"], "retrieved")
    assert new["output"] == [{"answer": "Charles Flint", "provenance": [{"id": "p1"}]}]
    assert new["meta"] == {"answer_is_regex": True, "extra": 1, "answer_pattern": [FLINT], "target_from": "retrieved"}
    assert obj["output"][0]["answer"] == FLINT  # not modified in place


class FakeRetriever:
    """Hands back fixed passages per question, in rank order."""

    def __init__(self, hits):
        self.hits = hits  # question -> [(title, text)]
        self.store = [None] * 10
        self.calls = []

    def search(self, questions, k):
        self.calls.append((list(questions), k))

        class Found:
            pass

        found = Found()
        found.titles = lambda: [[t for t, _ in self.hits[q][:k]] for q in questions]
        found.texts = lambda: [[x for _, x in self.hits[q][:k]] for q in questions]
        return found


def _write(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def _read(path):
    return [json.loads(x) for x in Path(path).read_text().splitlines() if x.strip()]


def test_derive_targets_with_controlled_passages(tmp_path):
    data = tmp_path / "ct"
    regex = {"answer_is_regex": True}
    train = [{"id": "t0", "input": "who founded ibm", "output": [{"answer": FLINT}], "meta": regex},
             {"id": "t1", "input": "beatles?", "output": [{"answer": "(the )?Beatles"}], "meta": regex},
             {"id": "t2", "input": "plain", "output": [{"answer": "Paris"}]},
             {"id": "t3", "input": "digits", "output": [{"answer": r"\d+"}], "meta": regex}]
    _write(data / "train.jsonl", train)
    _write(data / "valid.jsonl", train[:1])
    test_rows = [dict(train[0], id="s0")]
    _write(data / "test.jsonl", test_rows)
    (data / "prepare.json").write_text("{}\n")
    hits = {"who founded ibm": [("IBM", "Flint's company"),
                                ("Charles Flint", "Charles R. Flint, the Father of Trusts")],
            "beatles?": [("Music", "no band here")], "digits": [("Nothing", "no numbers")]}
    fake = FakeRetriever(hits)
    summary = derive_targets(str(data), "unused", k=1000, out=str(tmp_path / "out"), progress=False,
                             retriever=fake, batch_size=2)
    assert [k for _, k in fake.calls] == [10, 10, 10]  # clamped to the collection, 2 batches + valid
    out = tmp_path / "out"
    rows = _read(out / "train.jsonl")
    assert [r["id"] for r in rows] == ["t0", "t1", "t2"]  # t3 has no target: dropped and counted
    # "Flint" x1 in "IBM", then the title "Charles Flint" and "Charles R. Flint" -> Flint x2 wins over it
    assert rows[0]["output"][0]["answer"] == "Flint" and rows[0]["meta"]["target_from"] == "retrieved"
    assert rows[0]["meta"]["answer_pattern"] == [FLINT] and rows[0]["meta"]["answer_is_regex"] is True
    assert [o["answer"] for o in rows[1]["output"]] == ["the Beatles", "Beatles"]
    assert rows[1]["meta"]["target_from"] == "regex_expansion"
    assert rows[2] == train[2]
    assert _read(out / "test.jsonl") == test_rows  # test split untouched, copied
    assert (out / "prepare.json").read_text() == "{}\n"
    assert summary["splits"]["train"] == {"records": 4, "regex_records": 3, "retrieved": 1, "regex_expansion": 1,
                                          "dropped_no_target": 1, "patterns_not_compiling": 0}
    assert json.loads((out / "curatedtrec_targets.json").read_text()) == summary
    assert _read(data / "train.jsonl") == train  # the input is left alone when --out is elsewhere
    # rerunning on the output derives the same targets from the kept pattern
    again = derive_targets(str(out), "unused", progress=False, retriever=FakeRetriever(hits))
    assert _read(out / "train.jsonl") == rows and again["splits"]["train"]["retrieved"] == 1


# ------------------------------------------------------------------------------------ the script and the task
def _regex_data(world, d: Path) -> Path:
    """CuratedTrec-style records over the tiny world: capitals as patterns, one that never occurs."""
    countries = world["countries"]
    rows = [{"id": f"ct{i}", "input": f"What is the capital of {c}?",
             "output": [{"answer": f"{cap}|Zzyzx", "provenance": [{"id": f"c{i}"}]}],
             "meta": {"answer_is_regex": True}} for i, (c, cap) in enumerate(countries[:6])]
    rows.append({"id": "ctx", "input": "What is the capital of Nowhere?", "output": [{"answer": "(the )?Qwerty"}],
                 "meta": {"answer_is_regex": True}})
    _write(d / "train.jsonl", rows)
    _write(d / "valid.jsonl", rows[:2])
    _write(d / "test.jsonl", rows[2:4])
    return d


def _task(world, data):
    import rag_plugin

    rag_plugin.register()
    from rag_plugin.tasks.retrieval_augmented import RetrievalAugmentedConfig, RetrievalAugmentedTask

    return RetrievalAugmentedTask.setup_task(RetrievalAugmentedConfig(data=str(data), knowledge=str(world["ks"]),
                                                                      n_docs=2))


def test_task_refuses_regex_training_targets(tiny_world, tmp_path):
    data = _regex_data(tiny_world, tmp_path / "ct")
    task = _task(tiny_world, data)
    with pytest.raises(UserError) as err:
        task.load_dataset("train")
    msg = str(err.value)
    assert f"{data / 'train.jsonl'}:1:" in msg and "7 of 7 records have regular-expression answers" in msg
    assert msg.endswith(")") and "rag-curatedtrec-targets" in msg and "\n" not in msg
    task.load_dataset("test")  # generation on regex test records is fine (scored from the gold file)
    task.load_dataset("valid")  # loaded; a loss on it is refused where one is computed:
    valid = task.datasets["valid"]
    sample = valid.collater([valid[i] for i in range(len(valid))])
    with pytest.raises(UserError, match="target of the validation loss"):
        task.valid_step(sample, model=None, criterion=None)     # fairseq-validate / fairseq-train's validation
    with pytest.raises(UserError, match="target of the validation loss"):
        task.begin_epoch(1, model=None)                        # fairseq-train, before its first update


def test_script_on_tiny_knowledge_source(tiny_world, tmp_path):
    data = _regex_data(tiny_world, tmp_path / "ct")
    before_test = (data / "test.jsonl").read_text()
    out = tmp_path / "ct_targets"
    proc = subprocess.run([CURATEDTREC_TARGETS, "--data", str(data),
                           "--knowledge", str(tiny_world["ks"]), "--out", str(out), "--quiet"],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    assert summary["k"] == 40  # -k 1000 clamped to the 40 passages
    assert summary["splits"]["train"]["retrieved"] == 6 and summary["splits"]["train"]["regex_expansion"] == 1
    rows = _read(out / "train.jsonl")
    for row, (_, cap) in zip(rows[:-1], tiny_world["countries"]):
        assert row["output"][0]["answer"] == cap  # the capital occurs in its passage; Zzyzx nowhere
        assert row["output"][0]["provenance"] == [{"id": f"c{row['id'][2:]}"}]
        assert row["meta"]["answer_pattern"] == [f"{cap}|Zzyzx"] and row["meta"]["target_from"] == "retrieved"
    assert [o["answer"] for o in rows[-1]["output"]] == ["the Qwerty", "Qwerty"]
    assert (out / "test.jsonl").read_text() == before_test
    task = _task(tiny_world, out)
    task.load_dataset("train")
    ds = task.datasets["train"]
    target = task.tokenizer.decode([int(t) for t in ds.targets[0] if int(t) > 3])
    assert target.strip() == tiny_world["countries"][0][1]


def test_script_bad_data_dir_is_one_line_error(tiny_world, tmp_path):
    proc = subprocess.run([CURATEDTREC_TARGETS, "--data",
                           str(tmp_path / "nope"), "--knowledge", str(tiny_world["ks"])],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "nope" in lines[0]
