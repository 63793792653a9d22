"""Small gold/guess fixture files for the evaluation tests (written per test)."""
import pytest

from tests.evaluation.eval_data import GENERATE_QA, GOLD_QA, PASSAGES, write_jsonl


@pytest.fixture
def qa_files(tmp_path):
    gold = write_jsonl(tmp_path / "gold.jsonl", GOLD_QA)
    gen = tmp_path / "generate.out"
    gen.write_text(GENERATE_QA, encoding="utf-8")
    passages = write_jsonl(tmp_path / "passages.jsonl", PASSAGES)
    return {"gold": gold, "generate": gen, "passages": passages, "dir": tmp_path}
