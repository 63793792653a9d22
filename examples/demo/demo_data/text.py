"""Text helpers of the demo data: deterministic draws, case- and accent-folding, place-name
spelling variants, how far a passage supports a description, and English phrasing (articles,
"the United States", lists, numbers)."""
from __future__ import annotations

import difflib
import hashlib
import re
import unicodedata
from collections import Counter
from typing import Iterable, List, Sequence


def uniform(seed: int, key: str) -> float:
    """A deterministic uniform number in [0, 1) for (seed, key) (independent of PYTHONHASHSEED)."""
    digest = hashlib.sha256(f"{seed}\x00{key}".encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / float(1 << 64)


def fold(text: str) -> str:
    """Case- and accent-insensitive form, for comparisons only."""
    text = unicodedata.normalize("NFKD", text)
    text = "".join(ch for ch in text if not unicodedata.combining(ch))
    return " ".join(text.casefold().split())


def name_key(text: str) -> str:
    key = fold(text)
    return key[4:] if key.startswith("the ") else key


def place_key(text: str) -> str:
    key = fold(text)
    key = re.sub(r"\bsaint\b", "st", key)
    key = re.sub(r"\bcity of\b", "", key)
    return re.sub(r"[^0-9a-z]", "", key)


def spelling_variants(a: str, b: str) -> bool:
    """True if two place names differ only in spelling/detail (Bogotá/Bogota, Sana'a/Sanaa,
    Washington D.C./Washington, Naypyidaw/Nay Pyi Taw), not in which place they name."""
    ka, kb = place_key(a), place_key(b)
    if not ka or not kb:
        return ka == kb
    return ka == kb or ka in kb or kb in ka or difflib.SequenceMatcher(None, ka, kb).ratio() >= 0.8


WORD_RE = re.compile(r"\w+", re.UNICODE)
_STOP = frozenset("""a an the of in on at by for to from with and or as is are was were be its it
this that which who whom whose into onto than then also not no s""".split())


def _content_words(text: str) -> List[str]:
    words = []
    for w in WORD_RE.findall(fold(text)):
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


def fmt_number(value) -> str:
    value = float(value)
    if value.is_integer():
        return f"{int(value):,}"
    return f"{value:,.2f}".rstrip("0").rstrip(".")


def sentence(text: str) -> str:
    return text if text.endswith(".") else text + "."


def fill(template: str, **kw) -> str:
    """Fill a question/claim template; no doubled full stop ("Washington D.C..")."""
    text = template.format(**kw)
    return text[:-1] if text.endswith("..") else text


_THE_SUFFIXES = ("Islands", "Republic", "Emirates", "States", "Kingdom", "Netherlands", "Philippines",
                 "Bahamas", "Maldives", "Comoros", "Seychelles", "Territories", "Territory")
_THE_PREFIXES = ("United ", "Republic ", "Democratic Republic ", "Holy See")


def with_the(name: str, initial: bool = False) -> str:
    """'the United States', 'the Cook Islands'; unchanged for most names."""
    lower = name.lower()
    takes_the = name.endswith(_THE_SUFFIXES) or name.startswith(_THE_PREFIXES) or name == "Vatican"
    if lower.startswith("the ") or " the " in lower or not takes_the:
        return name
    return ("The " if initial else "the ") + name


def slug(title: str) -> str:
    return "_".join(title.split())


def join_or(items: Sequence[str], word: str = "or") -> str:
    items = list(items)
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + f" {word} " + items[-1]


class Casing:
    """Whether a capitalised first word is a common word (lower-case it) or a proper noun."""

    def __init__(self, texts: Iterable[str]):
        self.counts: Counter = Counter()
        for text in texts:
            self.counts.update(WORD_RE.findall(text))

    def lower_first(self, phrase: str) -> str:
        if not phrase:
            return phrase
        first = phrase.split()[0]
        word = WORD_RE.match(first)
        if not word:
            return phrase
        w = word.group(0)
        if w[1:] != w[1:].lower() or not w[0].isupper():
            return phrase  # acronym, number, already lower case
        if self.counts[w.lower()] > self.counts[w]:
            return phrase[0].lower() + phrase[1:]
        return phrase


def with_article(desc: str) -> str:
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
