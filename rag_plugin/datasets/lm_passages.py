"""A knowledge source's passages as language-model data: fairseq's binarized ``language_modeling`` dataset.

Each passage is one line of the knowledge source's own generator tokens, ``title </s> text </s>`` (the final
``</s>`` as ``fairseq-preprocess`` ends every line), so that with ``--sample-break-mode eos`` fairseq's LM reads
``</s> title </s> text`` and predicts each next token: the layout of a decoder-only reader's context
(rag_plugin/core/lm_layout.py). Written (``train``/``valid`` ``.bin``/``.idx`` and ``dict.txt``, the knowledge
source's generator dictionary) into a temporary folder, put in place when complete.
"""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Tuple

import numpy as np

from rag_plugin.util.errors import UserError
from rag_plugin.util.io import atomic_directory


def passage_line(title: np.ndarray, text: np.ndarray, eos: int) -> np.ndarray:
    """One passage as the LM reads it (without the leading ``</s>`` fairseq's LM dataset shifts in)."""
    parts = [np.asarray(title, dtype=np.int64), np.array([eos]), np.asarray(text, dtype=np.int64), np.array([eos])]
    if len(title) == 0:
        parts = parts[2:]
    return np.concatenate(parts)


def write_lm_passages(knowledge, out: Path, valid: int, seed: int = 0) -> Tuple[int, int]:
    """Write the passages of ``knowledge`` (a KnowledgeSource) under ``out``; (train, valid) passages written."""
    import torch

    from rag_plugin.util.quiet_import import import_fairseq_quietly

    import_fairseq_quietly()
    from fairseq.data import Dictionary, indexed_dataset

    store = knowledge.passages
    n = len(store)
    if n <= valid:
        raise UserError(f"only {n} passages for {valid} validation passages", path=str(knowledge.directory),
                        fix="lower --valid")
    tokenizer = knowledge.load_generator_tokenizer()
    dictionary = Dictionary.load(str(tokenizer.files.dict))
    order = np.random.default_rng(seed).permutation(n)
    with atomic_directory(out) as tmp:
        shutil.copyfile(tokenizer.files.dict, tmp / "dict.txt")
        for split, rows in (("valid", order[:valid]), ("train", order[valid:])):
            builder = indexed_dataset.make_builder(str(tmp / f"{split}.bin"), impl="mmap",
                                                   vocab_size=len(dictionary))
            for r in rows.tolist():
                line = passage_line(store.title_tokens(r), store.text_tokens(r), dictionary.eos())
                builder.add_item(torch.from_numpy(line.astype(np.int32)))
            builder.finalize(str(tmp / f"{split}.idx"))
    return n - valid, valid
