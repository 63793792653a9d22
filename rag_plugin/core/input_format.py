"""The generator's input for one (question, document) pair: the single definition.

Two formats, chosen when a knowledge source is built (its passages are pre-tokenized for
one of them, recorded in the passage store) and required by the model (``--input-format``,
kept in its checkpoint); the task checks that the two agree.

``plugin`` (the default)::

    <s> question </s> title </s> passage </s>

built from pre-tokenized ids, at most ``max_len`` tokens. The passage is cut at its end so
the question is never cut (unless the question alone exceeds the budget, in which case it is
truncated, with a warning, keeping room for nothing else). With no document (closed book):
``<s> question </s>``.

``hf`` (the reference implementation's, transformers' ``RagRetriever``)::

    <s> prefix + title + title_sep + text + doc_sep + question </s>

as one string (``title`` without one leading and one trailing ``"``, every ``"  "`` replaced
by ``" "``), tokenized by the generator's byte-level BPE and cut at the END to ``max_len``
tokens (so a long passage can cut the question off, as in the reference). The question is
the query encoder's tokenization decoded back to text (lower-cased by an uncased BERT), and
targets are ``<s> answer </s>`` (the BART tokenizer's). The plugin still never re-tokenizes
a passage in a training or decoding step: :meth:`InputFormat.passage_strings` gives the two
strings whose BPE pieces are stored per passage, chosen at BPE pre-tokenization boundaries
so that ``[<s>] + title_ids + text_ids + question_ids + [</s>]`` is exactly the BPE of the
whole string (boundaries are before a single space that follows a non-space and precedes a
non-space; where a passage offers none, all of it goes into ``title_ids``). One difference
remains: text that spells a special token (``<s>``, ``</s>``, ``<pad>``, ``<unk>``, ``<mask>``)
is that special id for the reference's tokenizer and ordinary BPE pieces here.

Targets (:func:`target_layout`, the task's ``--target-format``): the decoder reads
``decoder_start + target[:-1]`` and is scored on ``target``.

``plugin`` (the default): the decoder starts with ``</s>`` (fairseq's and BART's decoder start, as
in generation) and the target is ``answer </s>``, or ``<s> answer </s>`` in the ``hf`` input format
(transformers' labels as its ``generate`` writes them after ``</s>``).

``hf``: transformers' ``finetune_rag.py`` objective. It passes the BART tokenizer's
``<s> answer </s>`` as both ``decoder_input_ids`` and ``labels``, and ``RagTokenForGeneration`` /
``RagSequenceForGeneration.get_nll`` shift the labels one to the left: the decoder starts with
``<s>`` and the target is ``answer </s>``.
"""
from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import List, NamedTuple, Optional, Sequence, Tuple

import numpy as np
import torch

from rag_plugin.util.errors import UserError

logger = logging.getLogger(__name__)
_warned = {"question": False}

FORMATS = ("plugin", "hf")
TARGET_FORMATS = ("plugin", "hf")


@dataclass(frozen=True)
class InputFormat:
    """How (question, title, passage) become generator input ids; see the module docstring.

    ``title_sep``, ``doc_sep`` and ``prefix`` apply to ``hf`` only (transformers' RagConfig
    ``title_sep``, ``doc_sep`` and the generator config's ``prefix``).
    """

    name: str = "plugin"
    title_sep: str = " / "
    doc_sep: str = " // "
    prefix: str = ""

    def __post_init__(self):
        if self.name not in FORMATS:
            raise UserError(f"unknown input format {self.name!r}", fix=f"use one of {', '.join(FORMATS)}")
        if self.name == "hf":
            d = self.doc_sep
            if len(d) < 2 or d[-1] != " " or d[-2].isspace():
                raise UserError(f"doc_sep {d!r} is not supported: it must end in one space after a non-space "
                                "character (as the reference's ' // ' does)")

    # ------------------------------------------------------------------ identity
    @classmethod
    def plugin(cls) -> "InputFormat":
        return cls()

    @classmethod
    def hf(cls, title_sep: str = " / ", doc_sep: str = " // ", prefix: Optional[str] = None) -> "InputFormat":
        return cls("hf", title_sep, doc_sep, prefix or "")

    def identity(self) -> Optional[dict]:
        """What a passage store records (None for ``plugin``: older stores carry nothing)."""
        return None if self.name == "plugin" else asdict(self)

    @classmethod
    def from_identity(cls, ident: Optional[dict]) -> "InputFormat":
        if not ident:
            return cls()
        try:
            return cls(**{k: ident[k] for k in ("name", "title_sep", "doc_sep", "prefix") if k in ident})
        except TypeError as err:
            raise UserError(f"unreadable input format record {ident!r} ({err})") from None

    @classmethod
    def parse(cls, value: Optional[str]) -> "InputFormat":
        """``plugin``, ``hf`` (the reference's separators) or a JSON file written by
        ``rag-convert-hf`` (``input_format.json``)."""
        if value in (None, "", "plugin"):
            return cls()
        if value == "hf":
            return cls.hf()
        path = Path(value)
        if not path.is_file():
            raise UserError(f"unknown input format {value!r}",
                            fix="use plugin, hf, or the input_format.json written by rag-convert-hf")
        try:
            ident = json.loads(path.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as err:
            raise UserError(f"input format file is not JSON ({err})", path=str(path)) from None
        if not isinstance(ident, dict) or ident.get("name") not in FORMATS:
            raise UserError("not an input format record (needs a 'name': plugin or hf)", path=str(path))
        return cls.from_identity(ident)

    # ------------------------------------------------------------------ text -> strings to tokenize
    def passage_strings(self, title: str, text: str) -> Tuple[str, str]:
        """The two strings whose generator tokens a passage store keeps (title, text)."""
        if self.name == "plugin":
            return title, text
        t = title.removeprefix('"').removesuffix('"')
        whole = (self.prefix + t + self.title_sep + text + self.doc_sep).replace("  ", " ")
        head = (self.prefix + t + self.title_sep).replace("  ", " ")
        tail = (text + self.doc_sep).replace("  ", " ")
        if (head + tail == whole and len(head) >= 2 and head[-1] == " " and not head[-2].isspace()
                and tail[:1] and not tail[0].isspace()):
            return head[:-1], " " + tail[:-1]
        return whole[:-1], ""  # the final space of doc_sep starts the question's piece

    def question_string(self, question: str, decoded_query: Optional[str] = None) -> str:
        """The generator's question string: ``hf`` uses the query encoder's tokens decoded
        back to text (``decoded_query``) after the final space of ``doc_sep``."""
        if self.name == "plugin":
            return question
        q = question if decoded_query is None else decoded_query
        return (" " + q).replace("  ", " ")

    def target_prefix(self, bos: int) -> List[int]:
        """Tokens before an answer's own (``hf``: ``<s>``, as the BART tokenizer writes targets)."""
        return [bos] if self.name == "hf" else []

    # ------------------------------------------------------------------ ids -> generator input
    def pair(self, question: np.ndarray, title: Optional[np.ndarray], text: Optional[np.ndarray],
             bos: int, eos: int, max_len: int) -> np.ndarray:
        if self.name == "plugin":
            return pair_input(question, title, text, bos, eos, max_len)
        parts = [] if title is None else [title, text]
        body = np.concatenate([np.asarray(p, dtype=np.int64) for p in parts + [question]])[: max_len - 2]
        return np.concatenate([np.array([bos], dtype=np.int64), body, np.array([eos], dtype=np.int64)])

    def batch(self, questions: Sequence[np.ndarray], docs: Optional[Sequence[Sequence[tuple]]],
              bos: int, eos: int, pad: int, max_len: int):
        """Generator inputs for B questions x K documents, question-major.

        ``docs[b][k] = (title_ids, text_ids)``; ``docs=None`` gives closed-book inputs.
        Returns ``src_tokens`` Long[B*K, S] (right-padded) and ``src_lengths`` Long[B*K].
        """
        rows: List[np.ndarray] = []
        for b, q in enumerate(questions):
            if docs is None:
                rows.append(self.pair(q, None, None, bos, eos, max_len))
            else:
                rows.extend(self.pair(q, t, x, bos, eos, max_len) for t, x in docs[b])
        lengths = torch.tensor([len(r) for r in rows], dtype=torch.long)
        out = torch.full((len(rows), int(lengths.max())), pad, dtype=torch.long)
        for i, r in enumerate(rows):
            out[i, : len(r)] = torch.from_numpy(r)
        return out, lengths


PLUGIN = InputFormat()


class TargetLayout(NamedTuple):
    """How an answer becomes decoder input and target (see the module docstring)."""

    prefix: List[int]   # tokens before the answer's own in the target
    decoder_start: int  # the decoder's first input token


def target_layout(target_format: str, fmt: InputFormat, bos: int, eos: int) -> TargetLayout:
    """The targets of ``target_format`` (``plugin`` or ``hf``) for a model of input format ``fmt``."""
    if target_format == "hf":
        return TargetLayout([], bos)
    if target_format != "plugin":
        raise UserError(f"unknown target format {target_format!r}", fix=f"use one of {', '.join(TARGET_FORMATS)}")
    return TargetLayout(fmt.target_prefix(bos), eos)


def pair_input(question: np.ndarray, title: Optional[np.ndarray], text: Optional[np.ndarray],
               bos: int, eos: int, max_len: int) -> np.ndarray:
    """The ``plugin`` format for one pair (see the module docstring)."""
    q = question
    if len(q) + 2 > max_len:
        if not _warned["question"]:
            logger.warning("a question of %d tokens exceeds the generator's %d positions: truncated",
                           len(q), max_len)
            _warned["question"] = True
        q = q[: max_len - 2]
    parts = [np.array([bos], dtype=np.int64), q.astype(np.int64, copy=False), np.array([eos], dtype=np.int64)]
    if title is not None:
        budget = max_len - (len(q) + 2)
        title = title[: max(0, budget - 2)]
        budget -= len(title) + 1
        if budget > 1:
            parts += [title.astype(np.int64, copy=False), np.array([eos], dtype=np.int64),
                      text[: budget - 1].astype(np.int64, copy=False), np.array([eos], dtype=np.int64)]
    return np.concatenate(parts)


def batch_inputs(questions: Sequence[np.ndarray], docs: Optional[Sequence[Sequence[tuple]]],
                 bos: int, eos: int, pad: int, max_len: int, fmt: Optional[InputFormat] = None):
    """:meth:`InputFormat.batch` of ``fmt`` (default: the ``plugin`` format)."""
    return (fmt or PLUGIN).batch(questions, docs, bos, eos, pad, max_len)
