"""rag_plugin.evaluation.metrics: hand-computed cases and agreement with sacrebleu / rouge-score."""
import json
import math
import random

import pytest
import sacrebleu
from rouge_score import rouge_scorer

from rag_plugin.evaluation import metrics as M


# ------------------------------------------------------------------ normalisation, EM, F1
@pytest.mark.parametrize("raw, norm", [
    ("The Eiffel Tower", "eiffel tower"),
    ("  an   apple a day  ", "apple day"),
    ("A.B.C.", "abc"),
    ("Theater of the Absurd!", "theater of absurd"),  # "the" only as a whole word
    ("Hello,\tWorld\n", "hello world"),
    ("THE", ""),
    ("rock'n'roll", "rocknroll"),
    ("Anna and Theo", "anna and theo"),
    ("café – bar", "café – bar"),  # non-ASCII punctuation stays (as SQuAD/KILT do)
])
def test_normalize_answer(raw, norm):
    assert M.normalize_answer(raw) == norm


def test_exact_match_max_over_aliases():
    assert M.exact_match("the Big Apple", ["New York City", "big apple"]) == 1.0
    assert M.exact_match("New York", ["New York City", "big apple"]) == 0.0
    assert M.exact_match("Paris.", "paris") == 1.0
    assert M.exact_match("a", ["the"]) == 1.0  # both normalise to ""
    with pytest.raises(ValueError):
        M.exact_match("x", [])


def test_token_f1_hand_computed():
    assert M.token_f1("the cat sat on mat", "a cat sat on the mat") == 1.0
    assert M.token_f1("cat sat", "cat sat on mat") == pytest.approx(2 / 3)  # P=1, R=1/2
    assert M.token_f1("cat cat", "cat") == pytest.approx(2 / 3)  # P=1/2, R=1
    assert M.token_f1("dog", "cat") == 0.0
    assert M.token_f1("the", "a") == 1.0
    assert M.token_f1("", "paris") == 0.0
    # max over aliases: 2/3 against "william shakespeare", 1 against "shakespeare"
    assert M.token_f1("Shakespeare", ["William Shakespeare"]) == pytest.approx(2 / 3)
    assert M.token_f1("Shakespeare", ["William Shakespeare", "shakespeare"]) == 1.0


def test_per_example_and_mean():
    scores = M.per_example(M.exact_match, ["a", "b"], [["a"], ["c"]])
    assert scores == [1.0, 0.0]
    assert M.mean(scores) == 0.5
    with pytest.raises(ValueError):
        M.per_example(M.exact_match, ["a"], [])
    with pytest.raises(ValueError):
        M.mean([])


# ------------------------------------------------------------------ BLEU-1
def _sacre_bleu1(preds, refs_streams):
    bleu = sacrebleu.BLEU(max_ngram_order=1, smooth_method="none", lowercase=True)
    return bleu.corpus_score(preds, refs_streams).score / 100


def test_bleu1_hand_computed():
    # 3 matches of 3 hypothesis tokens, reference 6 tokens: BP = exp(1 - 6/3)
    assert M.bleu1(["the cat sat"], ["the cat sat on the mat"]) == pytest.approx(math.exp(-1))
    # clipping: "the" counted at most once (its count in the reference)
    assert M.bleu1(["the the the"], ["the cat"]) == pytest.approx(1 / 3)
    # multi-reference clipping uses the largest count in any reference
    assert M.bleu1(["the the cat"], [["the cat", "the the dog"]]) == pytest.approx(1.0)
    assert M.bleu1(["Who WROTE Hamlet?"], ["who wrote hamlet ?"]) == 1.0  # lower-cased, 13a splits "?"
    assert M.bleu1(["xyz"], ["abc"]) == 0.0
    assert M.bleu1([""], ["abc"]) == 0.0


def test_bleu1_matches_sacrebleu_random_corpus():
    rng = random.Random(0)
    words = "the a cat dog sat on mat hat who what Paris France wrote , . ?".split()
    preds = [" ".join(rng.choices(words, k=rng.randint(1, 12))) for _ in range(60)]
    refs1 = [" ".join(rng.choices(words, k=rng.randint(1, 12))) for _ in range(60)]
    refs2 = [" ".join(rng.choices(words, k=rng.randint(1, 12))) for _ in range(60)]
    assert M.bleu1(preds, refs1) == pytest.approx(_sacre_bleu1(preds, [refs1]), abs=1e-9)
    assert M.bleu1(preds, [[a, b] for a, b in zip(refs1, refs2)]) == pytest.approx(
        _sacre_bleu1(preds, [refs1, refs2]), abs=1e-9)


def test_bleu1_case_option():
    assert M.bleu1(["Paris"], ["paris"], lowercase=False) == 0.0
    assert M.bleu1(["Paris"], ["paris"]) == 1.0


# ------------------------------------------------------------------ corpus BLEU (sacrebleu)
def test_sacrebleu_corpus_matches_sacrebleu():
    preds = ["the cat sat on the mat", "a dog barked loudly at night"]
    refs = ["the cat sat on a mat", "the dog barked at night"]
    expected = sacrebleu.corpus_bleu(preds, [refs]).score / 100
    assert M.sacrebleu_corpus(preds, refs) == pytest.approx(expected)
    # by hand: clipped n-gram matches over the corpus 9/12, 5/10, 2/8, 1/6 (n = 1..4), 12 guess tokens
    # against 11 reference tokens (no brevity penalty): (0.75 * 0.5 * 0.25 / 6) ** (1/4) = 0.125 ** 0.5
    assert M.sacrebleu_corpus(preds, refs) == pytest.approx(0.125 ** 0.5, rel=1e-9)


def test_sacrebleu_corpus_variable_reference_counts():
    preds = ["the cat sat on the mat", "a dog barked loudly at night"]
    refs = [["the cat sat on a mat", "a cat sat on the mat"], ["the dog barked at night"]]
    expected = sacrebleu.corpus_bleu(preds, [["the cat sat on a mat", "the dog barked at night"],
                                             ["a cat sat on the mat", None]]).score / 100
    assert M.sacrebleu_corpus(preds, refs) == pytest.approx(expected)


# ------------------------------------------------------------------ ROUGE-L
def test_rouge_l_hand_computed():
    # LCS("a b c d", "a c d e") = "a c d": P = R = 3/4
    assert M.rouge_l(["a b c d"], ["a c d e"]) == pytest.approx(0.75)
    # the stemmer makes "running dogs" match "run dog"
    assert M.rouge_l(["running dogs"], ["run dog"]) == pytest.approx(1.0)
    assert M.rouge_l(["x y"], ["a b"]) == 0.0


def test_rouge_l_matches_rouge_score_with_max_over_references():
    scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=True)
    preds = ["the quick brown fox jumps", "paris is the capital of france"]
    refs = [["a quick brown dog jumped", "the fox jumps"], ["france's capital is paris"]]
    expected = [max(scorer.score(r, p)["rougeL"].fmeasure for r in rs) for p, rs in zip(preds, refs)]
    assert M.rouge_l(preds, refs) == pytest.approx(sum(expected) / 2)
    assert M.rouge_l_one(preds[0], refs[0]) == pytest.approx(expected[0])
    assert M.rouge_l_one(preds[0], refs[0]) > scorer.score(refs[0][0], preds[0])["rougeL"].fmeasure


# ------------------------------------------------------------------ FEVER
def test_label_accuracy_three_and_two_way():
    golds = ["SUPPORTS", "REFUTES", "NOT ENOUGH INFO", "SUPPORTS"]
    preds = ["supports", "SUPPORTS", "not_enough_info", "NOT ENOUGH INFO"]
    assert M.label_accuracy(preds, golds) == pytest.approx(2 / 4)
    # 2-way: the NEI claim is dropped; an NEI prediction on a SUPPORTS claim is wrong
    assert M.label_accuracy(preds, golds, two_way=True) == pytest.approx(1 / 3)
    assert M.label_accuracy(["nei"], ["NOT ENOUGH INFO"]) == 1.0
    assert M.label_accuracy(["garbage"], ["SUPPORTS"]) == 0.0


def test_label_accuracy_errors():
    with pytest.raises(ValueError):
        M.label_accuracy(["SUPPORTS"], ["MAYBE"])
    with pytest.raises(ValueError):
        M.label_accuracy(["SUPPORTS"], ["NOT ENOUGH INFO"], two_way=True)
    with pytest.raises(ValueError):
        M.label_accuracy([], [])


# ------------------------------------------------------------------ distinct n-grams
def test_distinct_ngram_ratio():
    # tri-grams: (a b c) (b c d) | (a b c)  -> 2 distinct of 3
    assert M.distinct_ngram_ratio(["a b c d", "A B C"]) == pytest.approx(2 / 3)
    assert M.distinct_ngram_ratio(["a a a a"], n=1) == pytest.approx(1 / 4)
    assert M.distinct_ngram_ratio(["a b", "c"]) == 0.0  # no tri-gram at all
    assert M.distinct_ngram_ratio(["x y z", "x y"], n=2) == pytest.approx(2 / 3)  # (x y) (y z) (x y)
    with pytest.raises(ValueError):
        M.distinct_ngram_ratio([])


# ------------------------------------------------------------------ retrieval
def test_retrieval_single_evidence_set_hand_example():
    gold = ["a", "b"]
    retrieved = ["x", "a", "y", "b", "z"]
    # KILT ranking: x=miss, {a,b} completes at b's position; points: [x, y, {a,b}, z]
    assert M.r_precision(retrieved, gold) == pytest.approx(1 / 2)  # top-2 = x, a
    assert M.recall_at_k(retrieved, gold, 2) == 0.0
    assert M.recall_at_k(retrieved, gold, 3) == 1.0
    assert M.precision_at_k(retrieved, gold, 3) == pytest.approx(1 / 3)
    assert M.precision_at_k(retrieved, gold, 1) == 0.0


def test_retrieval_alternative_evidence_sets():
    gold = [["a"], ["b", "c"]]
    retrieved = ["c", "x", "b"]
    assert M.r_precision(retrieved, gold) == pytest.approx(1 / 2)  # best set {b, c}: top-2 = c, x
    assert M.recall_at_k(retrieved, gold, 1) == 0.0
    assert M.recall_at_k(retrieved, gold, 2) == pytest.approx(1 / 2)  # points: [x, {b,c}]
    assert M.precision_at_k(retrieved, gold, 2) == pytest.approx(1 / 2)
    assert M.recall_at_k(["a", "b", "c"], gold, 3) == 1.0


def test_retrieval_singletons_and_edge_cases():
    assert M.recall_at_k(["p1", "p2", "p3"], [["p2"], ["p9"]], 2) == pytest.approx(1 / 2)
    assert M.r_precision(["p1", "p1", "p2"], ["p1", "p2"]) == 1.0  # duplicates dropped for R-prec
    assert M.r_precision([], ["p1"]) == 0.0
    assert M.recall_at_k([], ["p1"], 5) == 0.0
    assert M.r_precision(["p1"], []) == 0.0  # no gold provenance
    assert M.evidence_sets([["a", "b"], ["b", "a"], []]) == [frozenset({"a", "b"})]
    with pytest.raises(ValueError):
        M.recall_at_k(["a"], ["a"], 0)


def test_answer_in_top_k():
    texts = ["Lyon is a city.", "The capital of France is Paris.", None]
    assert M.answer_in_top_k(texts, ["Paris"], 1) == 0.0
    assert M.answer_in_top_k(texts, ["Paris"], 2) == 1.0
    assert M.answer_in_top_k(texts, ["the city of Lyon", "LYON"], 1) == 1.0
    assert M.answer_in_top_k(["a comparison"], ["paris"], 5) == 0.0  # whole tokens only
    assert M.answer_in_top_k(["the capital: paris, france"], ["Paris, France"], 1) == 1.0
    assert M.answer_in_top_k(["anything"], ["The"], 1) == 0.0  # empty alias ignored
    assert M.answer_in_top_k([], ["Paris"], 3) == 0.0


def test_split_passages_count_as_their_document():
    from rag_plugin.evaluation.inputs import document_ids

    gold = [["wiki:Ozone"]]
    assert document_ids(["wiki:Ozone_1", "wiki:Oxygen_0", "wiki:Ozone_0", "wiki:Ozone"], gold) == \
        ["wiki:Ozone", "wiki:Oxygen_0"]
    assert document_ids(["p_1"], [["p_1"]]) == ["p_1"]


def test_a_split_collection_ranks_documents_like_pages():
    """Passages of a split collection (ids <doc>_<n> throughout): two passages of a wrong document take
    one rank, so the metrics equal those of the same retrieval written as documents."""
    from rag_plugin.evaluation.inputs import document_ids, split_from_documents

    gold = [[["G"]]]
    split = [["X_0", "X_1", "G_0"]]
    assert split_from_documents(split, gold)
    assert document_ids(split[0], gold[0], split_documents=True) == ["X", "G"]
    assert document_ids(split[0], gold[0]) == ["X_0", "X_1", "G"]  # an unsplit collection: only gold merges
    assert not split_from_documents([["Apollo_11", "G"]], gold)  # gold itself retrieved: not a split collection
    assert not split_from_documents([["X", "Y"]], gold)


def test_evaluate_split_and_page_retrieval_agree(tmp_path):
    from rag_plugin.evaluation.scoring import evaluate_files

    gold = tmp_path / "gold.jsonl"
    gold.write_text(json.dumps({"id": "q1", "input": "q?", "output": [{"answer": "a", "provenance": [{"id": "G"}]}]})
                    + "\n")
    results = {}
    for name, ids in (("pages", ["X", "G"]), ("split", ["X_0", "X_1", "G_0"])):
        guess = tmp_path / f"{name}.jsonl"
        provenance = [{"id": i} for i in ids]
        guess.write_text(json.dumps({"id": "q1", "output": [{"answer": "a", "provenance": provenance}]}) + "\n")
        results[name] = evaluate_files(str(gold), str(guess), ["rprec", "recall@2", "precision@2"])
    assert results["split"] == results["pages"] == {"rprec": 0.0, "recall@2": 100.0, "precision@2": 50.0}


def test_k_beyond_the_retrieved_passages_is_warned(tmp_path, capsys):
    from rag_plugin.evaluation.scoring import evaluate_files

    gold = tmp_path / "gold.jsonl"
    gold.write_text(json.dumps({"id": "q1", "input": "q?", "output": [{"answer": "a", "provenance": [{"id": "G"}]}]})
                    + "\n")
    guess = tmp_path / "guess.jsonl"
    provenance = [{"id": "X"}, {"id": "G"}]
    guess.write_text(json.dumps({"id": "q1", "output": [{"answer": "a", "provenance": provenance}]}) + "\n")
    scores = evaluate_files(str(gold), str(guess), ["recall@20", "precision@2"])
    assert scores == {"recall@20": 100.0, "precision@2": 50.0}
    err = capsys.readouterr().err
    assert "recall@20 looks at 20 passages" in err and "more than 2" in err and "precision@2" not in err


def test_answer_in_top_k_counts_the_title():
    """Issue 25, item 8: where the answer is a passage's title (a page about the answer), the text
    need not repeat it: answer_in_top_k looks at the title and the text, each on its own."""
    texts = ["A YAML parser and emitter for Python.", "Lyon is a city."]
    titles = ["PyYAML", "Lyon"]
    assert M.answer_in_top_k(texts, ["PyYAML"], 1) == 0.0  # texts only: missed
    assert M.answer_in_top_k(texts, ["PyYAML"], 1, titles=titles) == 1.0
    assert M.answer_in_top_k(texts, ["Lyon"], 1, titles=titles) == 0.0  # the second passage is beyond k
    assert M.answer_in_top_k(texts, ["pyyaml"], 1, regex=True, titles=titles) == 1.0
    assert M.answer_in_top_k(texts, ["Py(YA|ya)ML"], 1, regex=True, titles=titles) == 1.0
    # an alias never straddles the end of the title and the start of the text
    assert M.answer_in_top_k(["France is in Europe."], ["Paris France"], 1, titles=["Paris"]) == 0.0
    assert M.answer_in_top_k(["x"], ["a"], 1, titles=[None]) == 0.0
    with pytest.raises(ValueError):
        M.answer_in_top_k(texts, ["a"], 1, titles=["one title"])


def test_evaluate_answer_in_top_k_reads_titles(tmp_path):
    """A corpus of package descriptions: every answer is the title of its gold passage. Before, answer_in_top1
    read 0% where recall@1 read 100%."""
    gold, guess = tmp_path / "gold.jsonl", tmp_path / "gen.out"
    rows = [("numpy", "The fundamental package for array computing with Python."),
            ("PyYAML", "YAML parser and emitter for Python."), ("requests", "Python HTTP for Humans.")]
    gold.write_text("".join(json.dumps({"id": f"q{i}", "input": f"which package: {text}", "output": [
        {"answer": name, "provenance": [{"id": f"p{i}"}]}]}) + "\n" for i, (name, text) in enumerate(rows)))
    passages = tmp_path / "passages.jsonl"
    passages.write_text("".join(json.dumps({"id": f"p{i}", "title": name, "text": text}) + "\n"
                                for i, (name, text) in enumerate(rows)))
    guess.write_text("".join(f"S-{i}\twhich package: {text}\nH-{i}\t-0.1\tx\nD-{i}\t-0.1\tx\n"
                             f"Z-{i}\t0\t1.0\tp{i}\t{name}\n" for i, (name, text) in enumerate(rows)))
    from rag_plugin.evaluation.scoring import evaluate_files

    assert evaluate_files(str(gold), str(guess), ["recall@1", "answer_in_top1"], passages=str(passages)) == \
        {"recall@1": 100.0, "answer_in_top1": 100.0}
    # KILT guesses that carry the passages' title and text need no --passages
    kilt = tmp_path / "guess.jsonl"
    kilt.write_text("".join(json.dumps({"id": f"q{i}", "output": [{"answer": "x", "provenance": [
        {"id": f"p{i}", "title": name, "text": text}]}]}) + "\n" for i, (name, text) in enumerate(rows)))
    assert evaluate_files(str(gold), str(kilt), ["answer_in_top1"]) == {"answer_in_top1": 100.0}
