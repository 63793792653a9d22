"""fairseq's BPE interface over the knowledge source's generator tokenizer (D lines come out as text).

fairseq-generate/-interactive print H lines as pieces and pass them (and S/T lines, and the BLEU
input) through this codec's ``decode``. ``--post-process sentencepiece`` (alias ``--remove-bpe
sentencepiece``) makes fairseq turn SentencePiece pieces into words itself first: then, as with
fairseq's own ``--post-process``, every line is already text, and the codec hands it back
unchanged (decoding words as pieces would make them all unknown). ``--post-process`` modes that
join pieces by other marks (``letter``, ``wordpiece``, ``_EOW``), or ``sentencepiece`` over GPT-2
ids, would garble the answers: refused.
"""
from typing import Optional

from rag_plugin.util.errors import UserError


class PieceCodec:
    """``already_text``: fairseq's ``--post-process sentencepiece`` made the lines text before
    ``decode`` sees them: ``decode`` returns them unchanged."""

    def __init__(self, tokenizer, already_text: bool = False):
        self.tokenizer = tokenizer
        self.already_text = already_text

    @classmethod
    def for_post_process(cls, tokenizer, post_process: Optional[str]) -> "PieceCodec":
        """The codec for fairseq's ``--post-process`` mode (see the module docstring)."""
        kind = getattr(tokenizer, "kind", None)
        if post_process == "sentencepiece" and kind == "sentencepiece":
            return cls(tokenizer, already_text=True)
        if post_process in ("letter", "wordpiece", "_EOW", "sentencepiece"):  # sentencepiece here: over GPT-2 ids
            raise UserError(f"--post-process {post_process} does not apply to this knowledge source's {kind} tokens",
                            fix="leave --post-process out: D lines are text already"
                                + (", or use --post-process sentencepiece" if kind == "sentencepiece" else ""))
        return cls(tokenizer)

    def encode(self, x: str) -> str:
        return " ".join(self.tokenizer.pieces(x))

    def decode(self, x: str) -> str:
        """Space-separated pieces -> text (text as it is when ``already_text``)."""
        if self.already_text:
            return x
        index = self.tokenizer.index
        ids = [index.get(p, 3) for p in x.split()]
        return self.tokenizer.decode(ids)

    def is_beginning_of_word(self, x: str) -> bool:
        return x.startswith("\u2581")
