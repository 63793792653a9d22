"""What decides a knowledge source's content: the build settings, their fingerprint, and the
passage side of an encoder's identity.

A build records ``BuildSettings.fingerprint()`` (input files by content hash) plus the passage
side of its encoder's identity (:func:`passage_side`) in ``.build/settings.json`` while it runs
and in the manifest's ``build_settings`` when done: a rerun with the same fingerprint resumes or
is up to date; anything else is refused, never mixed.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import List, Optional, Union

from rag_plugin.retrieval.tokenization import GeneratorTokenizerFiles
from rag_plugin.util.io import sha256_file


@dataclass
class BuildSettings:
    """Everything that determines a knowledge source's content (a rerun must match)."""

    passages: Union[str, List[str]]   # one file, or several read in order as one collection
    encoder: str = "minilm"
    index_factory: str = "Flat"
    split_words: Optional[int] = None
    #: the generator tokenizer the passages are pre-tokenized with (none: not pre-tokenized)
    tokenizer: GeneratorTokenizerFiles = field(default_factory=GeneratorTokenizerFiles)
    train_size: int = 100_000
    seed: int = 0
    input_format: Optional[dict] = None  # InputFormat.identity() the passages are pre-tokenized for
    index_file: Optional[str] = None      # an existing FAISS index over these rows, used as is
    num_shards: int = 1                   # the index written in this many shards (retrieval/shards.py)

    def fingerprint(self) -> dict:
        """The settings as recorded (the tokenizer's files at the top level, as builds have always recorded them),
        each input file with its content hash."""
        out = asdict(self)
        out.update(out.pop("tokenizer"))
        for key in ("input_format", "index_file"):  # absent when unset: older builds keep their fingerprint
            if out[key] is None:
                del out[key]
        if self.num_shards == 1:
            del out["num_shards"]
        if self.index_file:
            out["index_file_sha256"] = sha256_file(self.index_file)
            out["index_file"] = str(Path(self.index_file).resolve())
        if isinstance(self.passages, str):
            p = Path(self.passages)
            out["passages"] = str(p.resolve())
            out["passages_sha256"] = sha256_file(p)  # content, not mtime: a copied file still matches
        else:
            out["passages"] = [str(Path(p).resolve()) for p in self.passages]
            out["passages_sha256"] = [sha256_file(p) for p in self.passages]
        for key, path in self.tokenizer.paths().items():
            out[key + "_sha256"] = sha256_file(path)
            out[key] = str(Path(path).resolve())
        return out


def passage_files(settings: BuildSettings) -> List[str]:
    return [settings.passages] if isinstance(settings.passages, str) else list(settings.passages)


#: Fields of an encoder's ``identity()`` that do not bear on its document vectors: names and paths
#: (the same weights may live elsewhere) and the query tower (which an index does not depend on).
NOT_PASSAGE_SIDE = frozenset({"kind", "name", "spec", "source", "shared_towers", "weights_sha256",
                              "query_weights_sha256"})

#: Keys a build adds to :meth:`BuildSettings.fingerprint` in ``.build/settings.json`` (and, but for
#: the shard size, in the manifest's ``build_settings``); absent from builds by older versions.
ENCODER_IDENTITY = "encoder_identity"
SHARD_SIZE = "shard_size"


def passage_side(identity: dict) -> dict:
    """The fields of an encoder identity that decide its document vectors (weights and vocabulary
    hashes, dim, pooling, normalize, max_length, passage_format, lowercase, ...)."""
    return {k: v for k, v in (identity or {}).items() if k not in NOT_PASSAGE_SIDE}


def differences(old: dict, new: dict) -> List[str]:
    return sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))


def describe_differences(old: dict, new: dict, there: str = "there", here: str = "here", most: int = 3) -> str:
    """``"max_length 256 there, 8 here; ..."`` for the keys that differ (long hashes shortened)."""
    def show(d, k):
        if k not in d:
            return "not recorded"
        v = d[k]
        return f"{v[:12]}..." if isinstance(v, str) and len(v) > 16 else json.dumps(v)

    keys = differences(old, new)
    parts = [f"{k} {show(old, k)} {there}, {show(new, k)} {here}" for k in keys[:most]]
    if len(keys) > most:
        parts.append(f"{len(keys) - most} more")
    return "; ".join(parts)


def settings_part(recorded: dict) -> dict:
    """A recorded fingerprint without what the build adds to the settings' own."""
    return {k: v for k, v in recorded.items() if k not in (ENCODER_IDENTITY, SHARD_SIZE)}
