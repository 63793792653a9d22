"""What the decoder-only reader needs to know of a converted GPT-2 (``rag-convert-hf --gpt2``,
rag_plugin/conversion/hf_gpt2.py), without fairseq: the record that marks a conversion, and the fairseq ids that are
no GPT-2 token (``<s>``, ``<pad>``, ``<unk>``: their rows copy ``<|endoftext|>``'s, and the reader masks them)."""
import json
from pathlib import Path
from typing import Optional

#: fairseq's special ids (fixed by its Dictionary) that no GPT-2 token maps to
NOT_GPT2_IDS = (0, 1, 3)
#: the format of the record (conversion.json) rag-convert-hf --gpt2 writes beside its checkpoint
GPT2_CONVERSION_FORMAT = "rag_plugin.hf_gpt2_conversion/1"


def is_converted_gpt2(path: Optional[str]) -> bool:
    """Whether ``path`` is the checkpoint of a GPT-2 conversion (its ``conversion.json`` beside it)."""
    if not path:
        return False
    record = Path(path).parent / "conversion.json"
    if not record.is_file():
        return False
    try:
        return json.loads(record.read_text(encoding="utf-8")).get("format") == GPT2_CONVERSION_FORMAT
    except (ValueError, OSError):
        return False
