"""Self-supervised pretraining records from passages (rag_plugin.data.denoising)."""
from rag_plugin.data.denoising import denoising_records, pseudo_question_records
from rag_plugin.retrieval.passages import Passage

PASSAGES = [Passage(f"p{i}", f"Title {i}", " ".join(f"w{i}_{j}" for j in range(40))) for i in range(30)]


def test_pseudo_questions_are_answered_by_their_passage():
    records = pseudo_question_records(PASSAGES, seed=3)
    by_id = {p.id: p for p in PASSAGES}
    kinds = {"title": 0, "continuation": 0}
    for r in records:
        kind, pid = r["id"].split(":")[1:3]
        p = by_id[pid]
        words = p.text.split()[:30]           # only what the generator sees of the passage
        question, answer = r["input"].split(), r["output"][0]["answer"]
        assert r["output"][0]["provenance"][0]["id"] == pid
        starts = [i for i in range(len(words)) if words[i:i + len(question)] == question]
        assert starts, "the question is a run of the passage's words"
        if kind == "title":
            assert answer == p.title and 6 <= len(question) <= 10
        else:
            assert 3 <= len(question) <= 8
            follow = words[starts[0] + len(question):]
            assert answer.split() == follow[:len(answer.split())] and 1 <= len(answer.split()) <= 4
        kinds[kind] += 1
    assert kinds["title"] == kinds["continuation"] == len(PASSAGES)


def test_records_are_deterministic_and_skip_short_passages():
    short = [Passage("s", "Short", "only five words in here")]
    assert pseudo_question_records(short) == []
    assert pseudo_question_records(PASSAGES, seed=1) == pseudo_question_records(PASSAGES, seed=1)
    assert pseudo_question_records(PASSAGES, seed=1) != pseudo_question_records(PASSAGES, seed=2)
    assert len(denoising_records(PASSAGES)) == len(PASSAGES)
