"""Self-supervised pretraining records from passages (rag_plugin.datasets.denoising)."""
import re

from rag_plugin.datasets.denoising import clause_start, denoising_records, pseudo_question_records
from rag_plugin.retrieval.passages import Passage

# Words w<i>_<j>; every 7th ends a clause (a full stop or a comma), so answers stop early.
PASSAGES = [Passage(f"p{i}", f"Title {i}", " ".join(f"w{i}_{j}" + ("." if j % 7 == 6 else "," if j % 7 == 3 else "")
                                                     for j in range(40))) for i in range(30)]


def test_pseudo_questions_are_answered_by_their_passage():
    records = pseudo_question_records(PASSAGES, seed=3)
    by_id = {p.id: p for p in PASSAGES}
    kinds = {"title": 0, "continuation": 0}
    for r in records:
        kind, pid = r["id"].split(":")[1:3]
        p = by_id[pid]
        words = p.text.split()[:30]           # only what the generator sees of the passage
        answer = r["output"][0]["answer"]
        assert r["output"][0]["provenance"][0]["id"] == pid
        if kind == "title":
            question = r["input"].split()
            assert answer == p.title and 6 <= len(question) <= 10
        else:
            m = re.fullmatch(r'What comes after "(.+)"\?', r["input"])
            assert m, r["input"]
            question = m.group(1).split()
            assert 3 <= len(question) <= 8
        starts = [i for i in range(len(words)) if words[i:i + len(question)] == question]
        assert starts, "the question is a run of the passage's words"
        if kind == "continuation":
            follow = words[starts[0] + len(question):]
            n = len(answer.split())
            assert 1 <= n <= 4
            # the words that follow, punctuation only on the last one (then dropped), or 4 words
            assert [w.rstrip(".,") for w in follow[:n]] == answer.split()
            assert all(not w.endswith((".", ",")) for w in follow[:n - 1])
            assert follow[n - 1].endswith((".", ",")) or n == 4 or len(follow) == n
        kinds[kind] += 1
    assert kinds["title"] == kinds["continuation"] == len(PASSAGES)


def test_clause_start_stops_at_the_clause_end():
    assert clause_start("Lobamba. Its currency is".split()) == "Lobamba"
    assert clause_start("(BYN). Its population".split()) == "BYN"
    assert clause_start("King Edward Point. Its".split()) == "King Edward Point"
    assert clause_start("one two three four five".split()) == "one two three four"
    assert clause_start("a, b c".split()) == "a"
    assert clause_start(["...", "a"]) == ""
    assert clause_start("the Belarusian ruble) and".split()) == "the Belarusian ruble"


def test_records_are_deterministic_and_skip_short_passages():
    short = [Passage("s", "Short", "only five words in here")]
    assert pseudo_question_records(short) == []
    assert pseudo_question_records(PASSAGES, seed=1) == pseudo_question_records(PASSAGES, seed=1)
    assert pseudo_question_records(PASSAGES, seed=1) != pseudo_question_records(PASSAGES, seed=2)
    assert len(denoising_records(PASSAGES)) == len(PASSAGES)
