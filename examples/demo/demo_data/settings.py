"""The demo build's settings: sizes, thresholds and the SentencePiece options (part of the key that
tells whether a build is up to date), the split names and the format version."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

FORMAT_VERSION = "rag_plugin.demo/2"  # 2: hot-swap test entities held out of every training split
SPLITS = ("train", "valid", "test")


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


DEFAULT_CONFIG = DemoConfig()
