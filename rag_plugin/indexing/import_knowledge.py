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

:func:`import_knowledge` takes what to import as an :class:`ImportRequest` (the options of
``rag-import-knowledge``) and how the build runs as :class:`~rag_plugin.indexing.builder.BuildOptions`.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Optional, Sequence

from rag_plugin.indexing.builder import BuildHooks, BuildOptions, build_knowledge_source
from rag_plugin.indexing.converted_checkpoint import read_conversion
from rag_plugin.indexing.precomputed import PrecomputedVectors
from rag_plugin.indexing.settings import BuildSettings
from rag_plugin.indexing.vector_sources import DPRVectorFiles, HuggingFaceDataset, require_file
from rag_plugin.retrieval.knowledge import IMPORTED
from rag_plugin.retrieval.tokenization import GeneratorTokenizerFiles
from rag_plugin.util.errors import UserError

NO_SPEC_FIX = ("pass --rag-checkpoint DIR (a converted RAG model), --encoder-spec (e.g. hf-dpr:DIR), or an "
               "--encoder-identity JSON that has a 'spec'")
#: rows per vectors shard of an import (the unit of resume): imported vectors cost nothing to make again
IMPORT_SHARD_SIZE = 65536


@dataclasses.dataclass
class ImportRequest:
    """What to import and how its manifest describes it (``rag-import-knowledge``'s options)."""

    dataset: Optional[str] = None  # a Hugging Face knowledge dataset (folder, .arrow or .parquet) with embeddings
    passages: Optional[str] = None  # DPR's psgs_w100.tsv (with vectors)
    vectors: Sequence[str] = ()  # DPR's embedding pickles, or .npy files (with ids)
    ids: Sequence[str] = ()  # the passage ids of each .npy file of vectors
    trust_pickles: bool = False  # read DPR's pickled vectors (a pickle can run code)
    faiss_index: Optional[str] = None  # an existing FAISS index over the passages in order, used instead of one built
    rag_checkpoint: Optional[str] = None  # a converted RAG checkpoint folder: the defaults of the next three
    encoder_spec: Optional[str] = None  # the query encoder that goes with the vectors
    encoder_identity: object = None  # the document encoder's identity (dict, inline JSON or a JSON file), not loaded
    tokenizer: GeneratorTokenizerFiles = dataclasses.field(default_factory=GeneratorTokenizerFiles)
    input_format: Optional[str] = None  # plugin, hf or an input_format.json
    index_factory: str = "Flat"  # FAISS factory string when no faiss_index is given
    train_size: int = 100_000  # vectors sampled to train the quantizer
    seed: int = 0  # seed of that sample


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
    from rag_plugin.retrieval.encoders import load_encoder  # start-up: torch; --help stays light

    loaded = load_encoder(spec).identity()
    query = {**loaded, "spec": loaded.get("spec", spec)}
    if not query.get("shared_towers"):  # a bi-encoder: its own passage tower is named as the vectors' encoder
        return VectorsEncoder(spec, query)
    document = {"kind": IMPORTED, "name": f"vectors imported from {source.name}", "spec": spec,
                "dim": query.get("dim"), "vectors_fingerprint": source.fingerprint}
    return VectorsEncoder(spec, document, query)


def _checkpoint_defaults(request: ImportRequest) -> ImportRequest:
    """``request`` with its encoder spec, tokenizer files and input format defaulting to the converted checkpoint's."""
    if not request.rag_checkpoint:
        return request
    rec = read_conversion(request.rag_checkpoint)
    tokenizer = request.tokenizer
    if not (tokenizer.dict or tokenizer.subword_model):
        tokenizer = rec["tokenizer"]
    return dataclasses.replace(request, encoder_spec=request.encoder_spec or rec["encoder_spec"], tokenizer=tokenizer,
                               input_format=request.input_format or rec["input_format_file"])


def import_knowledge(out_dir: str, request: ImportRequest, options: Optional[BuildOptions] = None):
    """Import a knowledge source (see the module docstring) from ``request.dataset`` (a Hugging Face dataset)
    or ``request.passages`` with ``vectors`` (+ ``ids``); returns the loaded KnowledgeSource. ``options``: how
    the build runs (default: :data:`IMPORT_SHARD_SIZE` rows per shard)."""
    from rag_plugin.core.input_format import InputFormat  # start-up: torch; --help stays light

    options = options or BuildOptions(shard_size=IMPORT_SHARD_SIZE)
    if (request.dataset is None) == (request.passages is None):
        raise UserError("pass either --dataset (a Hugging Face dataset) or --passages with --vectors (DPR's TSV)")
    request = _checkpoint_defaults(request)
    fmt = InputFormat.parse(request.input_format)
    if request.faiss_index is not None and not Path(request.faiss_index).is_file():
        raise UserError("FAISS index file not found", path=request.faiss_index, fix="check --faiss-index")
    if request.dataset is not None and (request.vectors or request.ids):
        raise UserError("--vectors/--ids go with --passages; a dataset holds its own embeddings")
    source = (HuggingFaceDataset(request.dataset) if request.dataset is not None
              else DPRVectorFiles(request.passages, list(request.vectors), list(request.ids), request.trust_pickles,
                                  options.progress, options.log))
    encoders = vectors_encoder(request.encoder_identity, request.encoder_spec, source)
    if options.shard_size < 1:
        raise UserError(f"--shard-size must be positive, got {options.shard_size}")
    settings = ImportSettings(passages=source.passage_files, encoder=encoders.spec, index_factory=request.index_factory,
                              split_words=None, tokenizer=request.tokenizer, train_size=request.train_size,
                              seed=request.seed, input_format=fmt.identity(), index_file=request.faiss_index,
                              imported=source.settings_fields(encoders.document))
    precomputed = PrecomputedVectors(source.batches, encoders.document, passages_path=source.passages_path,
                                     missing_fix=source.missing_fix,
                                     manifest=encoders.manifest_entries(source.provenance()))
    return build_knowledge_source(str(out_dir), settings, options,
                                  BuildHooks(collection=source.collection, precomputed=precomputed))
