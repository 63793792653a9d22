"""The options of the RAG models (``rag_token``, ``rag_seq``; FiD extends them): :class:`RagConfig`, and what a model
reads of them (the generator's initialisation, the towers' learning-rate scale). The README's docs/training.md and
docs/document-encoder.md explain them at length."""
from dataclasses import dataclass, field
from typing import Any, Optional

from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from omegaconf import II

from rag_plugin.models.doc_encoder import DEFAULT_CHUNK
from rag_plugin.optim.lr_scale import resolved_scale


@dataclass
class RagConfig(FairseqDataclass):
    generator_size: ChoiceEnum(["tiny", "base", "large"]) = field(default="tiny", metadata={
        "help": "generator size: tiny (2+2 layers, d=192), base (bart.base) or large (bart.large)"})
    generator_embed_dim: int = field(default=0, metadata={"help": "override the size preset's model dimension"})
    generator_layers: int = field(default=0, metadata={"help": "override the preset's encoder and decoder layers"})
    generator_heads: int = field(default=0, metadata={"help": "override the preset's attention heads"})
    generator_ffn_dim: int = field(default=0, metadata={"help": "override the preset's feed-forward dimension"})
    generator_positions: ChoiceEnum(["learned", "sinusoidal"]) = field(default="learned", metadata={
        "help": "position embeddings of a generator trained from scratch: learned (BART's) or sinusoidal"})
    generator_init: ChoiceEnum(["auto", "bart", "xavier"]) = field(default="auto", metadata={
        "help": "initialisation of a generator trained from scratch; auto = xavier for tiny, bart otherwise"})
    generator_checkpoint: Optional[str] = field(default=None, metadata={
        "help": "initialise the generator from a fairseq BART model.pt (bart.base / bart.large)"})
    freeze_generator: bool = field(default=False, metadata={
        "help": "keep the generator (reader) fixed: only the retriever learns (REPLUG's frozen LM)"})
    query_encoder: str = field(default="knowledge", metadata={
        "help": "query encoder initialisation: knowledge (the knowledge source's), random, or dpr:CKPT / hf-dpr:DIR"})
    freeze_query_encoder: bool = field(default=False, metadata={
        "help": "keep the query encoder fixed (the paper's 'Frozen' ablation)"})
    freeze_query_embeddings: bool = field(default=False, metadata={
        "help": "keep the query encoder's token embeddings fixed (train its layers only)"})
    query_encoder_lr_scale: float = field(default=0.0, metadata={
        "help": "the retriever towers learn at this multiple of --lr; 0 = min(1, 3e-5 / --lr)"})
    lr: Any = II("optimization.lr")
    doc_score_scale: float = field(default=0.0, metadata={
        "help": "p(z|x) = softmax(scale * q.d); 0 = 1 for DPR, 20 for L2-normalised encoders (MiniLM)"})
    dropout: float = field(default=0.1, metadata={"help": "generator dropout"})
    generator_torch_dropout: bool = field(default=False, metadata={
        "help": "use torch's F.dropout in the generator instead of the plugin's cheaper mask"})
    attention_dropout: float = field(default=0.0, metadata={"help": "generator attention dropout"})
    activation_dropout: float = field(default=0.0, metadata={"help": "generator activation dropout"})
    max_source_positions: int = field(default=256, metadata={"help": "generator input length (question + passage)"})
    input_format: ChoiceEnum(["plugin", "hf"]) = field(default="plugin", metadata={
        "help": "generator input format: plugin, or hf (converted Hugging Face checkpoints)"})
    max_target_positions: int = field(default=128, metadata={"help": "generator output length"})
    train_doc_encoder: bool = field(default=False, metadata={
        "help": "train a document encoder too: the retrieved rows are scored by it on their texts in each step"})
    share_encoder_towers: bool = field(default=False, metadata={
        "help": "with --train-doc-encoder: one tower (the query encoder) encodes questions and documents"})
    rerank_top: int = field(default=0, metadata={
        "help": "with --train-doc-encoder: re-score this many index candidates and keep the top --n-docs; 0 = none"})
    doc_encoder_chunk: int = field(default=DEFAULT_CHUNK, metadata={
        "help": "with --train-doc-encoder: passages per forward of the document encoder (0 = all at once)"})
    doc_encoder_train_layers: int = field(default=0, metadata={
        "help": "with --train-doc-encoder: train only the top N layers (the lower ones cached); 0 = the whole tower"})


def generator_init(cfg) -> str:
    """--generator-init with auto resolved: xavier for the tiny size (copying is learned far sooner), bart otherwise."""
    init = str(getattr(cfg, "generator_init", "auto"))
    if init == "auto":
        return "xavier" if str(cfg.generator_size) == "tiny" else "bart"
    return init


def lr_scale(cfg) -> float:
    """The towers' learning-rate scale of a model built with ``cfg`` (``--query-encoder-lr-scale``, 0 resolved)."""
    return resolved_scale(cfg.query_encoder_lr_scale, getattr(cfg, "lr", None))


def as_config(cfg, config_class=RagConfig) -> RagConfig:
    """fairseq hands a Namespace (CLI) or a DictConfig (hydra/checkpoint): make it a ``config_class``."""
    if isinstance(cfg, config_class):
        return cfg
    values = {}
    for name in config_class.__dataclass_fields__:
        try:
            value = getattr(cfg, name, None)
        except Exception:  # an interpolation (``lr: ${optimization.lr}``) this config cannot resolve
            value = None
        if not name.startswith("_") and value is not None:
            values[name] = value
    return config_class(**values)
