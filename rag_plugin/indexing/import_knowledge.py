"""Import a knowledge source whose document vectors were computed elsewhere (``rag-import-knowledge``):
the one import path for a Hugging Face knowledge dataset and for DPR's ``psgs_w100.tsv`` with its
vectors (read by :mod:`rag_plugin.indexing.vector_sources`, placed by
:class:`~rag_plugin.indexing.precomputed.PrecomputedVectors`). The knowledge builder does the work
(:func:`~rag_plugin.indexing.build_knowledge_source`: same layout, manifest last, resumable) with its
``collection``/``precomputed`` hooks; nothing is re-embedded.

What the manifest records about the encoders (:func:`vectors_encoder`):

* ``encoder_spec``: the query encoder to use with the vectors (``--encoder-spec``, or the
  ``--rag-checkpoint``'s question encoder);
* ``encoder``: the document encoder, where it is known: an ``--encoder-identity`` given, or the
  passage tower of an ``--encoder-spec`` that has one of its own (``hf-dpr:DIR`` with
  ``ctx_encoder/``). Otherwise (a question encoder alone) it is not known: ``encoder`` says
  ``"kind": "imported"`` with the vectors' dimension and fingerprint, and the query encoder's
  identity is recorded apart as ``query_encoder``;
* ``imported_vectors``: where the vectors came from (the dataset or files, their sizes, a
  fingerprint of their names and sizes, and ``datasets``' own fingerprint when it saved them).

With ``rag_checkpoint`` (a folder written by ``rag-convert-hf``) the query encoder spec, the
generator tokenizer and the input format default to the converted model's.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Optional, Sequence

from rag_plugin.indexing.builder import build_knowledge_source
from rag_plugin.indexing.precomputed import PrecomputedVectors
from rag_plugin.indexing.settings import BuildSettings
from rag_plugin.indexing.vector_sources import DPRVectorFiles, HuggingFaceDataset, require_file
from rag_plugin.retrieval.knowledge import IMPORTED
from rag_plugin.util.errors import UserError

NO_SPEC_FIX = ("pass --rag-checkpoint DIR (a converted RAG model), --encoder-spec (e.g. hf-dpr:DIR), or an "
               "--encoder-identity JSON that has a 'spec'")


@dataclasses.dataclass
class ImportSettings(BuildSettings):
    """The builder's settings plus what the vectors came from (part of the fingerprint, at its top level)."""

    imported: dict = dataclasses.field(default_factory=dict)

    def fingerprint(self) -> dict:
        out = super().fingerprint()
        out.update(out.pop("imported"))
        return out


@dataclasses.dataclass
class VectorsEncoder:
    """The encoders of imported vectors: the spec of the query encoder, the document encoder's identity
    (``kind: imported`` when unknown) and, when the document encoder is unknown, the query encoder's."""

    spec: str
    document: dict
    query: Optional[dict] = None

    def manifest_entries(self, provenance: dict) -> dict:
        out = {"imported_vectors": provenance}
        if self.query is not None:
            out["query_encoder"] = self.query
        return out


def load_identity(encoder_identity) -> Optional[dict]:
    """An encoder identity given as a dict, inline JSON or a JSON file (a whole ``manifest.json`` works)."""
    if encoder_identity is None or isinstance(encoder_identity, dict):
        return encoder_identity
    text = str(encoder_identity)
    source = None
    if not text.lstrip().startswith("{"):
        source = require_file(text, "encoder identity file")
        text = source.read_text(encoding="utf-8")
    try:
        ident = json.loads(text)
    except json.JSONDecodeError as err:
        raise UserError(f"encoder identity is not valid JSON ({err.msg})", path=None if source is None else str(source),
                        fix="pass a JSON object, e.g. the 'encoder' entry of another knowledge source's manifest.json"
                        ) from None
    if not isinstance(ident, dict):
        raise UserError("encoder identity must be a JSON object", fix="e.g. {\"name\": ..., \"dim\": 768, ...}")
    if isinstance(ident.get("encoder"), dict) and "format" in ident:  # a whole manifest.json
        ident = dict(ident["encoder"], spec=ident.get("encoder_spec"))
    return ident


def vectors_encoder(encoder_identity, encoder_spec: Optional[str], source) -> VectorsEncoder:
    """What is known of the encoders of ``source``'s vectors (see the module docstring). A spec is
    required (``encoder_spec`` wins over the identity's); without an identity the spec is loaded."""
    identity = load_identity(encoder_identity)
    spec = encoder_spec or (identity or {}).get("spec")
    if not spec:
        raise UserError("no encoder spec: the manifest must name the query encoder for these vectors", fix=NO_SPEC_FIX)
    if identity is not None:
        return VectorsEncoder(spec, {**identity, "spec": identity.get("spec", spec)})
    from rag_plugin.retrieval.encoders import load_encoder

    loaded = load_encoder(spec).identity()
    query = {**loaded, "spec": loaded.get("spec", spec)}
    if not query.get("shared_towers"):  # a bi-encoder: its own passage tower is named as the vectors' encoder
        return VectorsEncoder(spec, query)
    document = {"kind": IMPORTED, "name": f"vectors imported from {source.name}", "spec": spec,
                "dim": query.get("dim"), "vectors_fingerprint": source.fingerprint}
    return VectorsEncoder(spec, document, query)


def _checkpoint_defaults(rag_checkpoint: Optional[str], encoder_spec: Optional[str], tokenizer: dict,
                         input_format: Optional[str]):
    """``(encoder spec, tokenizer files, input format)``, defaulting to the converted checkpoint's."""
    if not rag_checkpoint:
        return encoder_spec, tokenizer, input_format
    from rag_plugin.conversion.hf_rag import read_conversion

    rec = read_conversion(rag_checkpoint)
    if not (tokenizer["dict"] or tokenizer["bpe_model"] or tokenizer["gpt2_encoder_json"]):
        tokenizer = dict(tokenizer, dict=rec["files"]["dict"], gpt2_encoder_json=rec["files"]["gpt2_encoder_json"],
                         gpt2_vocab_bpe=rec["files"]["gpt2_vocab_bpe"])
    return encoder_spec or rec["encoder_spec"], tokenizer, input_format or rec["input_format_file"]


def import_knowledge(out_dir: str, dataset: Optional[str] = None, passages: Optional[str] = None,
                     vectors: Sequence[str] = (), ids: Sequence[str] = (), trust_pickles: bool = False,
                     faiss_index: Optional[str] = None, rag_checkpoint: Optional[str] = None,
                     encoder_spec: Optional[str] = None, encoder_identity=None, dict_file: Optional[str] = None,
                     bpe_model: Optional[str] = None, gpt2_encoder_json: Optional[str] = None,
                     gpt2_vocab_bpe: Optional[str] = None, input_format: Optional[str] = None,
                     index_factory: str = "Flat", train_size: int = 100_000, seed: int = 0,
                     shard_size: int = 65536, restart: bool = False, progress: bool = True, log=print):
    """Import a knowledge source (see the module docstring) from ``dataset`` (a Hugging Face dataset)
    or ``passages`` with ``vectors`` (+ ``ids``); returns the loaded KnowledgeSource."""
    from rag_plugin.core.input_format import InputFormat

    if (dataset is None) == (passages is None):
        raise UserError("pass either --dataset (a Hugging Face dataset) or --passages with --vectors (DPR's TSV)")
    tokenizer = dict(dict=dict_file, bpe_model=bpe_model, gpt2_encoder_json=gpt2_encoder_json,
                     gpt2_vocab_bpe=gpt2_vocab_bpe)
    encoder_spec, tokenizer, input_format = _checkpoint_defaults(rag_checkpoint, encoder_spec, tokenizer,
                                                                 input_format)
    fmt = InputFormat.parse(input_format)
    if faiss_index is not None and not Path(faiss_index).is_file():
        raise UserError("FAISS index file not found", path=faiss_index, fix="check --faiss-index")
    if dataset is not None and (vectors or ids):
        raise UserError("--vectors/--ids go with --passages; a dataset holds its own embeddings")
    source = (HuggingFaceDataset(dataset) if dataset is not None
              else DPRVectorFiles(passages, list(vectors), list(ids), trust_pickles, progress, log))
    encoders = vectors_encoder(encoder_identity, encoder_spec, source)
    if shard_size < 1:
        raise UserError(f"--shard-size must be positive, got {shard_size}")
    settings = ImportSettings(passages=source.passage_files, encoder=encoders.spec, index_factory=index_factory,
                              split_words=None, **tokenizer, train_size=train_size, seed=seed,
                              input_format=fmt.identity(), index_file=faiss_index,
                              imported=source.settings_fields(encoders.document))
    precomputed = PrecomputedVectors(source.batches, encoders.document, passages_path=source.passages_path,
                                     missing_fix=source.missing_fix,
                                     manifest=encoders.manifest_entries(source.provenance()))
    return build_knowledge_source(str(out_dir), settings, collection=source.collection, precomputed=precomputed,
                                  shard_size=shard_size, restart=restart, progress=progress, log=log)
