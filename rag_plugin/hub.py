"""Python entry point: load a checkpoint with its knowledge source and answer questions.

    from rag_plugin.hub import RAG
    rag = RAG.from_pretrained("checkpoints/rag_token/checkpoint_best.pt")      # knowledge from the checkpoint
    rag = RAG.from_pretrained(ckpt, knowledge="data/other_ks", n_docs=10)        # hot-swapped index
    rag = RAG.from_pretrained(ckpt, device="cuda")     # on this process's GPU (or later: rag.to("cuda:1"))
    for r in rag.generate(["What is the capital of Burundi?"], beam=4):
        print(r["answer"], r["provenance"][0]["title"], r["provenance"][0]["p"])

In the manner of fairseq's hub interfaces; it drives the same task, model and generators as
``fairseq-generate``. A library: it installs no hook, changes no global state of the host process
(logging, warnings, excepthook, torch's allow-list), and reports bad input as a
:class:`~rag_plugin.util.errors.UserError` that the caller may catch; it never ends the process.

The model computes where it is put (``device=`` or :meth:`RAG.to`; the CPU unless asked, as fairseq's and Hugging
Face's loaders do): the questions' tensors follow it, the index is searched on the CPU. A model cast to half
precision afterwards (``rag.model.half()``) still reloads: its document tower is the one it loaded.
"""
import json
from pathlib import Path
from typing import List, Optional, Sequence

import torch

from rag_plugin.models import doc_encoder
from rag_plugin.util.devices import model_device, resolve_device
from rag_plugin.util.errors import UserError
from rag_plugin.util.quiet_import import import_fairseq_quietly
from rag_plugin.util.safe_load import checkpoint_load_error, checkpoint_task_options, checkpoint_types_allowed


def load_fairseq_checkpoint(path: str, arg_overrides: Optional[dict] = None) -> dict:
    """fairseq's own checkpoint loader (``arg_overrides`` applied to the saved config, as fairseq's do) under
    ``weights_only=True`` with the plugin's allow-list in scope only (torch's global allow-list is not changed); a
    missing, truncated or unsafe file is a one-line :class:`UserError`."""
    from fairseq import checkpoint_utils  # a light module until a checkpoint is loaded

    if not Path(path).is_file():
        raise UserError("checkpoint not found", path=path, fix="pass the path of a checkpoint*.pt")
    try:
        with checkpoint_types_allowed():
            return checkpoint_utils.load_checkpoint_to_cpu(path, arg_overrides)
    except UserError:
        raise
    except Exception as err:  # torch: UnpicklingError / RuntimeError / EOFError for unsafe or damaged files
        raise checkpoint_load_error(path, err) from None


def task_overrides(knowledge=None, n_docs=None, rag_decoding=None, retriever=None, nprobe=None, ef_search=None,
                   private_index=False, reranker=None, rerank_candidates=None) -> dict:
    """``from_pretrained``'s arguments as fairseq's ``arg_overrides`` of the checkpoint's task config. With
    ``knowledge`` (a hot swap) the checkpoint's search settings, made for its own index, are dropped."""
    task = {"private_index": bool(private_index)}
    if knowledge is not None:
        task.update(knowledge=knowledge, nprobe=nprobe, ef_search=ef_search)
    given = {"nprobe": nprobe, "ef_search": ef_search, "n_docs": n_docs, "rag_decoding": rag_decoding,
             "retriever": retriever, "reranker": reranker, "rerank_candidates": rerank_candidates}
    task.update({k: v for k, v in given.items() if v is not None})
    return {"task": task}


def recorded_knowledge(state: dict, checkpoint: str) -> str:
    """The knowledge source a checkpoint's task names: as typed for fairseq-train (relative to where it ran), else
    the resolved path the model records; a one-line error when neither is here."""
    typed = state["cfg"].task.get("knowledge")
    if typed and Path(typed).is_dir():
        return typed
    recorded = json.loads((state["model"].get("_extra_state") or {}).get("knowledge") or "{}").get("knowledge")
    if recorded and Path(recorded).is_dir():
        return recorded
    raise UserError(f"the checkpoint's knowledge source {typed!r} is not here", path=checkpoint,
                    fix="pass knowledge=KS_DIR (a knowledge source with the same encoder)")


class RAG:
    def __init__(self, task, model):
        self.task = task
        self.model = model.eval()

    @classmethod
    def from_pretrained(cls, checkpoint: str, knowledge: Optional[str] = None, n_docs: Optional[int] = None,
                        rag_decoding: Optional[str] = None, retriever: Optional[str] = None,
                        nprobe: Optional[int] = None, ef_search: Optional[int] = None,
                        private_index: bool = False, device: Optional[str] = "cpu", reranker: Optional[str] = None,
                        rerank_candidates: Optional[int] = None) -> "RAG":
        """Load through fairseq's ``load_model_ensemble_and_task`` with these arguments as its ``arg_overrides``
        (as fairseq's BART ``from_pretrained``). ``nprobe`` / ``ef_search``: search settings of an IVF / HNSW index;
        with ``knowledge`` (a hot swap) the checkpoint's own, made for its index, are dropped. ``private_index``: read
        a private copy of the FAISS index instead of mapping it shared. ``device``: where the model runs (cpu, cuda:
        this process's GPU, cuda:N; None: a GPU when there is one, else the CPU); a GPU without CUDA is a one-line
        error, before anything is loaded. ``reranker``: the reranking stage's ``--reranker`` (None: the checkpoint's;
        over a checkpoint trained with one, that one or ``"none"``: a one-line error otherwise; over one trained
        without, any: zero-shot); ``rerank_candidates``: its ``--rerank-candidates`` L (default: the checkpoint's)."""
        where = resolve_device(device, "device")
        import_fairseq_quietly()
        import rag_plugin  # the package root: registers the plugin

        rag_plugin.register()
        from fairseq import checkpoint_utils  # after import_fairseq_quietly (its import logs otherwise)
        from fairseq.dataclass.utils import overwrite_args_by_name  # after import_fairseq_quietly

        if reranker is not None:  # its weights (maxsim, cross) are in the checkpoint, its query encoder fixed
            trained = str(checkpoint_task_options(checkpoint).get("reranker") or "none")
            if trained != "none" and reranker not in ("none", trained):
                raise UserError(f"reranker {reranker!r} is not the one the checkpoint was trained with ({trained})",
                                path=checkpoint, fix="leave reranker out (the checkpoint's), or load a checkpoint "
                                                     f"trained with --reranker {reranker}")
        overrides = task_overrides(knowledge, n_docs, rag_decoding, retriever, nprobe, ef_search, private_index,
                                   reranker, rerank_candidates)
        state = load_fairseq_checkpoint(checkpoint, overrides)
        if knowledge is None:  # the path as typed for fairseq-train, else as the model records it
            overwrite_args_by_name(state["cfg"], {"task": {"knowledge": recorded_knowledge(state, checkpoint)}})
        models, _, task = checkpoint_utils.load_model_ensemble_and_task([checkpoint], state=state)
        return cls(task, models[0]).to(where)

    def to(self, device) -> "RAG":
        """Move the model to ``device`` (as ``from_pretrained``'s); returns self."""
        self.model.to(resolve_device(device, "device"))
        return self

    @property
    def device(self):
        """The ``torch.device`` the model computes on."""
        return model_device(self.model)

    @property
    def version(self) -> int:
        """The version of the knowledge source this model reads (kept until :meth:`reload`)."""
        return self.task.knowledge.version

    def reload(self) -> int:
        """Read the knowledge source's current version from now on (after ``rag-update-knowledge``; the
        version opened so far is kept until then, whatever is switched). Returns the version now read."""
        version = self.task.reopen_knowledge(models=[self.model])
        # --train-doc-encoder: are the new version's vectors its encoder's (the tower as loaded: the model may have
        # been cast to half precision since)?
        doc_encoder.check_document_agreement(self.model, just_loaded=False)
        return version

    def sample(self, questions: Sequence[str]) -> dict:
        """``questions`` as one batch of the task's dataset, on the model's device (a model moved to a GPU)."""
        from fairseq import utils  # loaded by from_pretrained already

        dataset = self.task.build_dataset(list(questions))
        sample = dataset.collater([dataset[i] for i in range(len(dataset))])
        device = self.device
        return utils.apply_to_sample(lambda t: t.to(device), sample)

    def search(self, questions: Sequence[str]):
        """The passages the model reads for ``questions`` (its own first stage and reranker, exactly as generation
        retrieves them): a :class:`~rag_plugin.retrieval.retriever.Retrieval` of K rows each, best first (-1 where
        fewer were found); its scores are the logits of p(z|x)."""
        from rag_plugin.reranking.late_interaction import found

        model, ni = self.model, self.sample(questions)["net_input"]
        with torch.no_grad():
            scores, rows = model.retrieve(ni.get("query_tokens"), ni.get("query_mask"), model.n_docs,
                                          ni.get("fixed_doc_rows"), ni.get("fixed_doc_scores"), ni["src_tokens"])
        return found(scores, rows, model.retriever.store)

    @property
    def tokenizer(self):
        return self.task.tokenizer

    def generate(self, questions: Sequence[str], beam: int = 4, nbest: int = 1, max_len_b: int = 64,
                 lenpen: float = 1.0, batch_size: int = 16, **generation) -> List[dict]:
        """Answers with provenance: one dict per question (``nbest`` > 1 adds ``alternatives``).

        ``score``: the answer's (length-normalised) log-probability in nats, as fairseq's generators
        return it; fairseq-generate prints the same number in base 2 (divided by ln 2)."""
        from fairseq.dataclass.configs import GenerationConfig  # loaded by from_pretrained already

        from rag_plugin.generation.adapters import retrieval_of  # imports fairseq

        args = GenerationConfig(beam=beam, nbest=nbest, max_len_a=0, max_len_b=max_len_b, lenpen=lenpen, **generation)
        generator = self.task.build_generator([self.model], args)
        store = self.task.knowledge.passages
        results: List[dict] = []
        questions = list(questions)
        for start in range(0, len(questions), batch_size):
            chunk = questions[start:start + batch_size]
            sample = self.sample(chunk)
            with torch.no_grad():
                hypos = generator.generate([self.model], sample)
            rows, doc_lp = retrieval_of(hypos)
            for i, question in enumerate(chunk):
                answers = [{"answer": self.tokenizer.decode([t for t in h["tokens"].tolist()]),
                            "score": float(h["score"])} for h in hypos[i][:nbest]]  # fairseq keeps the beam
                provenance = []
                if rows is not None:
                    probs = doc_lp[i].exp()
                    for k in torch.argsort(probs, descending=True).tolist():
                        row = int(rows[i, k])
                        provenance.append({"id": store.id(row), "title": store.title(row), "text": store.text(row),
                                           "p": float(probs[k])})
                results.append({"question": question, "answer": answers[0]["answer"], "score": answers[0]["score"],
                                "alternatives": answers[1:], "provenance": provenance})
        return results
