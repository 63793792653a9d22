#!/usr/bin/env python
"""A generated corpus for the worked example (examples/own_corpus/run.py): invented islands, each
described in one passage of about 40 words that states seven facts (sea, population, capital, main
export, highest mountain, language, year of settlement), and question/answer pairs
about them in KILT JSONL, split by island into train / valid / test (no island is asked about in two
splits). About a quarter of the questions are answered by the passage's TITLE (the island's name):
"Which island has Port Ardel as its capital?".

    python examples/own_corpus/make_corpus.py --out DIR [--islands 300] [--questions-per-island 3] [--seed 0]

Writes DIR/passages.jsonl ({"id", "title", "text"}) and DIR/qa/{train,valid,test}.jsonl
({"id", "input", "output": [{"answer", "provenance": [{"wikipedia_id", "title"}]}]}). The same seed
and options give the same files, byte for byte. Everything is invented here: nothing is downloaded.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import Dict, List

ONSETS = ["b", "br", "c", "d", "dr", "f", "g", "h", "k", "l", "m", "n", "p", "qu", "r", "s", "t", "th",
          "tr", "v", "w", "z", "sk", "st"]
VOWELS = ["a", "e", "i", "o", "u", "ai", "ea", "ou", "y"]
CODAS = ["", "", "n", "r", "l", "s", "th", "m", "nd", "rk", "sh", "x"]
SEAS = ["the Coral Sea", "the Tasman Sea", "the Arafura Sea", "the Sulu Sea", "the Banda Sea", "the Timor Sea",
        "the Celebes Sea", "the Andaman Sea", "the Java Sea", "the Bismarck Sea", "the Solomon Sea",
        "the Philippine Sea"]
EXPORTS = ["pearls", "vanilla", "copper", "sea salt", "coffee", "teak", "wool", "sponges", "cinnamon", "tin",
           "cocoa", "coconut oil", "sugar cane", "indigo", "nutmeg", "black pepper", "rubber", "tobacco"]
CAPITAL_FORMS = ["Port {}", "{} Harbour", "Saint {}", "{}ville", "New {}", "{} Bay"]
QUESTION_KINDS = ("capital", "sea", "population", "export", "mountain", "language", "settled",
                  "title_capital", "title_mountain")
SPLITS = (("train", 0.8), ("valid", 0.1), ("test", 0.1))


def invented_word(rng: random.Random, syllables: int) -> str:
    word = "".join(rng.choice(ONSETS) + rng.choice(VOWELS) for _ in range(syllables)) + rng.choice(CODAS)
    return word.capitalize()


class Names:
    """Invented words, each used once in the whole corpus (islands, towns, mountains, languages)."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.used: set = set()

    def new(self, syllables: int) -> str:
        while True:
            word = invented_word(self.rng, syllables)
            if word.lower() not in self.used and len(word) >= 4:
                self.used.add(word.lower())
                return word


def make_island(i: int, rng: random.Random, names: Names) -> Dict[str, str]:
    """One island's facts (every value a string, as it is written in its passage)."""
    name = names.new(rng.choice((2, 3)))
    return {"id": f"island{i:04d}", "name": name,
            "capital": rng.choice(CAPITAL_FORMS).format(names.new(2)),
            "sea": rng.choice(SEAS),
            "population": f"{rng.randrange(1200, 98000, 100):,}",
            "export": rng.choice(EXPORTS),
            "mountain": f"Mount {names.new(2)}",
            "language": names.new(2) + rng.choice(("ese", "ic", "an", "i")),
            "settled": str(rng.randrange(1420, 1890))}


def description(f: Dict[str, str], rng: random.Random) -> str:
    """The island's passage: its facts in sentences whose order and wording vary. The island's name is
    its title; the text says "the island" (questions answered by the name are answered by the title)."""
    first = rng.choice([f"The island lies in {f['sea']} and has {f['population']} inhabitants.",
                        f"An island in {f['sea']}, it has a population of {f['population']}."])
    facts = [rng.choice([f"Its capital is {f['capital']}.", f"The capital is {f['capital']}."]),
             rng.choice([f"The main export is {f['export']}.", f"It mainly exports {f['export']}."]),
             rng.choice([f"Its highest point is {f['mountain']}.", f"{f['mountain']} is its highest peak."]),
             f"Most islanders speak {f['language']}.",
             rng.choice([f"It was first settled in {f['settled']}.", f"Settlers arrived in {f['settled']}."])]
    rng.shuffle(facts)
    return " ".join([first, *facts])


def question(kind: str, f: Dict[str, str]) -> tuple:
    """(question, answer) of one kind about the island ``f``."""
    name = f["name"]
    return {"capital": (f"What is the capital of {name}?", f["capital"]),
            "sea": (f"In which sea does {name} lie?", f["sea"].removeprefix("the ")),
            "population": (f"How many people live on {name}?", f["population"]),
            "export": (f"What is the main export of {name}?", f["export"]),
            "mountain": (f"What is the highest mountain on {name}?", f["mountain"]),
            "language": (f"Which language do most people on {name} speak?", f["language"]),
            "settled": (f"In what year was {name} first settled?", f["settled"]),
            "title_capital": (f"Which island has {f['capital']} as its capital?", name),
            "title_mountain": (f"On which island is {f['mountain']}?", name)}[kind]


def qa_records(f: Dict[str, str], rng: random.Random, per_island: int) -> List[dict]:
    """``per_island`` questions about one island, of different kinds; one in four asks for its name."""
    asks_title = per_island > 1 and rng.random() < min(1.0, 0.25 * per_island)
    facts = rng.sample([k for k in QUESTION_KINDS if not k.startswith("title")], per_island - asks_title)
    kinds = facts + ([rng.choice(("title_capital", "title_mountain"))] if asks_title else [])
    out = []
    for kind in kinds:
        text, answer = question(kind, f)
        out.append({"id": f"{f['id']}:{kind}", "input": text,
                    "output": [{"answer": answer, "provenance": [{"wikipedia_id": f["id"], "title": f["name"]}]}],
                    "meta": {"kind": kind}})
    return out


def build(islands: int, per_island: int, seed: int) -> Dict[str, List[dict]]:
    """{"passages": [...], "train": [...], "valid": [...], "test": [...]}."""
    rng = random.Random(seed)
    names = Names(rng)
    facts = [make_island(i, rng, names) for i in range(islands)]
    passages = [{"id": f["id"], "title": f["name"], "text": description(f, rng)} for f in facts]
    order = list(range(islands))
    rng.shuffle(order)
    out: Dict[str, List[dict]] = {"passages": passages}
    start = 0
    for n, (split, share) in enumerate(SPLITS):
        size = islands - start if n == len(SPLITS) - 1 else max(1, round(share * islands))
        out[split] = [r for i in sorted(order[start:start + size]) for r in qa_records(facts[i], rng, per_island)]
        start += size
    return out


def write_jsonl(path: Path, rows: List[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    tmp.replace(path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--islands", type=int, default=300, help="number of islands (passages); at least 10")
    ap.add_argument("--questions-per-island", type=int, default=3, help="questions about each island (1-7)")
    ap.add_argument("--seed", type=int, default=0, help="seed of every random choice")
    args = ap.parse_args(argv)
    if args.islands < 10 or not 1 <= args.questions_per_island <= 7:
        ap.error("--islands must be at least 10 and --questions-per-island between 1 and 7")
    corpus = build(args.islands, args.questions_per_island, args.seed)
    out = Path(args.out)
    for split in ("train", "valid", "test"):  # the passages last: their presence means the corpus is complete
        write_jsonl(out / "qa" / f"{split}.jsonl", corpus[split])
    write_jsonl(out / "passages.jsonl", corpus["passages"])
    sizes = ", ".join(f"{len(corpus[s])} {s}" for s in ("train", "valid", "test"))
    print(f"{out}: {len(corpus['passages'])} passages; questions: {sizes}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
