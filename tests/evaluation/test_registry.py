"""rag_plugin.evaluation.registry: every metric registered once; names, labels, kinds and needs come from it."""
import pytest

from rag_plugin.evaluation import registry as R
from rag_plugin.evaluation.records import GoldExample, Guess
from rag_plugin.evaluation.scoring import evaluate
from rag_plugin.util.errors import UserError

EXPECTED = {  # spelling: (label of an instance, kind)
    "em": ("EM", R.TEXT), "f1": ("F1", R.TEXT), "bleu1": ("B-1", R.TEXT), "rougeL": ("R-L", R.TEXT),
    "bleu": ("BLEU", R.TEXT), "accuracy": ("FVR3", R.TEXT), "accuracy2": ("FVR2", R.TEXT),
    "distinct<N>": ("Dist-3", R.TEXT), "rprec": ("R-Prec", R.RETRIEVAL), "recall@<K>": ("R@3", R.RETRIEVAL),
    "precision@<K>": ("P@3", R.RETRIEVAL), "answer_in_top<K>": ("Ans@3", R.RETRIEVAL),
}


def test_the_registered_metrics():
    assert R.known_metrics() == ", ".join(EXPECTED)
    for spelling, (label, kind) in EXPECTED.items():
        name = spelling.replace("<N>", "3").replace("<K>", "3")
        metric, number = R.lookup(name)
        assert (R.metric_label(name), metric.kind, number) == (label, kind, 3 if "<" in spelling else None)
        assert (R.RETRIEVED in metric.needs) == (kind == R.RETRIEVAL)
        assert (R.ANSWERS in metric.needs) == (kind == R.TEXT)
    assert R.PASSAGE_TEXTS in R.lookup("answer_in_top5")[0].needs
    assert R.FEVER_LABELS in R.lookup("accuracy2")[0].needs
    assert R.metric_label("custom") == "custom"  # a column from a results file the plugin does not compute


def test_task_defaults_are_registered_names():
    for task in R.TASKS:
        assert [R.canonical_metric(n) for n in R.default_metrics(task)] == R.default_metrics(task)


def test_a_name_registers_once():
    with pytest.raises(ValueError, match="registered twice"):
        R.register(R.Metric("EM", "EM", R.TEXT, frozenset(), lambda x, _: 0.0))


def test_adding_a_metric_is_one_registration(monkeypatch):
    monkeypatch.setattr(R, "_METRICS", dict(R._METRICS))
    monkeypatch.setattr(R, "_PARAMETERISED", R._PARAMETERISED)
    R.register(R.Metric("longer_than", "Len>{}", R.TEXT, frozenset({R.ANSWERS}),
                        lambda x, n: sum(len(p) > n for p in x.predictions) / len(x.predictions), parameter="N"))
    gold = [GoldExample("a", "q", ["x"], [[]]), GoldExample("b", "q", ["y"], [[]])]
    guesses = [Guess("a", "four"), Guess("b", "twelve chars")]
    assert R.parse_metrics("EM,Longer_Than5") == ["em", "longer_than5"]
    assert R.metric_label("longer_than5") == "Len>5"
    assert "longer_than<N>" in R.known_metrics()
    assert evaluate(gold, guesses, ["longer_than5", "em"]) == {"longer_than5": 50.0, "em": 0.0}
    with pytest.raises(UserError, match="no 'answer'"):  # what it needs is checked before it runs
        evaluate(gold, [Guess("a", None), guesses[1]], ["longer_than5"])
