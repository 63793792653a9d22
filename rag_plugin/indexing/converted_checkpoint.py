"""The record a converted Hugging Face RAG checkpoint directory holds (``conversion.json``, written by
``rag-convert-hf``: :mod:`rag_plugin.conversion.hf_rag`), read where a knowledge source is imported for it
(``rag-import-knowledge --rag-checkpoint``). Here, below both, so that building knowledge never imports the
converter."""
from __future__ import annotations

import json
from pathlib import Path

from rag_plugin.retrieval.tokenization import GeneratorTokenizerFiles
from rag_plugin.util.errors import UserError

#: the record's format tag
FORMAT = "rag_plugin.hf_rag_conversion/1"
RECORD = "conversion.json"


def read_conversion(directory: str) -> dict:
    """The ``conversion.json`` of a converted checkpoint directory, with absolute file paths (``tokenizer``: the
    generator tokenizer's files, a :class:`GeneratorTokenizerFiles`)."""
    d = Path(directory)
    path = d / RECORD
    if not path.is_file():
        raise UserError("not a converted RAG checkpoint directory (no conversion.json)", path=str(d),
                        fix="pass the --out folder of rag-convert-hf")
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        raise UserError(f"not valid JSON ({err})", path=str(path)) from None
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise UserError("not a converted RAG checkpoint directory (conversion.json of another format)",
                        path=str(path), fix="pass the --out folder of rag-convert-hf")
    tokenizer = GeneratorTokenizerFiles.in_directory(d, record["generator_tokenizer"])
    return {**record, "tokenizer": tokenizer, "input_format_file": str(d / "input_format.json"),
            "checkpoint": str(d / "checkpoint.pt")}
