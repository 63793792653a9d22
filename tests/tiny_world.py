"""A tiny synthetic world for fast end-to-end tests: passages about invented countries,
capital questions, a SentencePiece generator vocabulary and a knowledge source built with a
small random encoder (the real build pipeline, seconds on CPU)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

SYL = ["ka", "lo", "mi", "ra", "to", "ne", "su", "vi", "de", "po", "ga", "ri"]


def _name(rng, n=3):
    return "".join(rng.choice(SYL, size=n)).capitalize()


def make_world(root: Path, n_countries: int = 40, seed: int = 0) -> dict:
    from rag_plugin.datasets.vocab import train_spm, write_fairseq_dict_from_spm
    from rag_plugin.indexing import BuildOptions, build_knowledge_source

    rng = np.random.default_rng(seed)
    root.mkdir(parents=True, exist_ok=True)
    countries, seen = [], set()
    while len(countries) < n_countries:
        c, cap = _name(rng), _name(rng, 2)
        if c in seen:
            continue
        seen.add(c)
        countries.append((c, cap))
    passages = [{"id": f"c{i}", "title": c, "text": f"{c} is a country. The capital of {c} is {cap}."}
                for i, (c, cap) in enumerate(countries)]
    (root / "passages.jsonl").write_text("".join(json.dumps(p) + "\n" for p in passages))
    records = [{"id": f"q{i}", "input": f"What is the capital of {c}?",
                "output": [{"answer": cap, "provenance": [{"id": f"c{i}"}]}]} for i, (c, cap) in enumerate(countries)]
    data = root / "qa"
    data.mkdir(exist_ok=True)
    splits = {"train": records[: n_countries - 10], "valid": records[n_countries - 10: n_countries - 5],
              "test": records[n_countries - 5:]}
    for split, rows in splits.items():
        (data / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = [p["text"] for p in passages] + [r["input"] for r in records]
    train_spm(text * 3, root / "spm.model", root / "spm.vocab", vocab_size=100, byte_fallback=False)
    write_fairseq_dict_from_spm(root / "spm.model", root / "dict.txt")
    build_knowledge_source(str(root / "ks"), world_settings(root), BuildOptions(progress=False, log=lambda m: None))
    return {"root": root, "data": data, "ks": root / "ks", "countries": countries}


def world_settings(root: Path, num_shards: int = 1, layers: int = 1):
    """The build settings of the world's knowledge source (its index in ``num_shards`` shards, an encoder of
    ``layers`` layers)."""
    from rag_plugin.indexing import BuildSettings
    from rag_plugin.retrieval.tokenization import GeneratorTokenizerFiles

    tokenizer = GeneratorTokenizerFiles(dict=str(root / "dict.txt"), bpe_model=str(root / "spm.model"))
    return BuildSettings(passages=str(root / "passages.jsonl"),
                         encoder=f"random:dim=32,layers={layers},heads=2,intermediate=64,seed=0", index_factory="Flat",
                         tokenizer=tokenizer, num_shards=num_shards)


def sharded_knowledge(world: dict, num_shards: int) -> Path:
    """The world's knowledge source built again with its index in ``num_shards`` shards (once per world)."""
    from rag_plugin.indexing import BuildOptions, build_knowledge_source

    out = world["root"] / f"ks_{num_shards}_shards"
    if not (out / "manifest.json").is_file():
        build_knowledge_source(str(out), world_settings(world["root"], num_shards),
                               BuildOptions(progress=False, log=lambda m: None))
    return out


def layered_knowledge(world: dict, layers: int) -> Path:
    """The world's knowledge source built again with an encoder of ``layers`` layers (once per world)."""
    from rag_plugin.indexing import BuildOptions, build_knowledge_source

    out = world["root"] / f"ks_{layers}_layers"
    if not (out / "manifest.json").is_file():
        build_knowledge_source(str(out), world_settings(world["root"], layers=layers),
                               BuildOptions(progress=False, log=lambda m: None))
    return out
