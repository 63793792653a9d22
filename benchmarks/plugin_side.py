"""rag_plugin on the tiny benchmark world: task, models, training step, generation, and the bare
generator step (the floor: the same B x K concatenated inputs through BART alone)."""
import copy
from pathlib import Path

import torch
import torch.nn.functional as F
from world import SPEC, load_corpus


def _import_plugin():
    import rag_plugin

    rag_plugin.register()


class PluginSide:
    name = "plugin"

    def __init__(self, world: Path, dropout: str = "fast", adam: str = "fused"):
        """``dropout``: the generator's dropout, "fast" (the plugin's default) or "torch" (F.dropout).
        ``adam``: "fused", the torch optimizer ``--optimizer torch_adamw`` builds (torch's fused AdamW),
        or "single" (``torch.optim.Adam``'s per-tensor loop, the benchmark's optimizer before 2026-12-01)."""
        _import_plugin()
        from rag_plugin.tasks.retrieval_augmented import RetrievalAugmentedConfig, RetrievalAugmentedTask

        self.world = world
        self.dropout = dropout
        self.adam = adam
        cfg = RetrievalAugmentedConfig(data=str(world / "qa_t8"), knowledge=str(world / "ks"), n_docs=SPEC["n_docs"],
                                       max_query_tokens=64)
        self.task = RetrievalAugmentedTask.setup_task(cfg)
        corpus = load_corpus(world)
        qa = corpus["qa"]
        questions = [ex["question"] for ex in qa]
        bs = SPEC["batch_size"]
        self.batches = {}
        for t in SPEC["target_tokens"]:
            ds = self.task.build_dataset(questions, [ex[f"answer_t{t}"] for ex in qa])
            self.batches[t] = [ds.collater([ds[i] for i in range(s, s + bs)]) for s in range(0, len(qa), bs)]

    # ------------------------------------------------------------------ models
    def model_config(self, dropout: str = ""):
        from rag_plugin.models.rag import RagConfig

        g = SPEC["generator"]
        # BART's N(0, 0.02), as transformers initialises its side (the tiny preset's default is
        # Xavier; with it the random RAG-Sequence beams differ per document and Thorough would
        # have several times transformers' candidates to score)
        return RagConfig(generator_size="tiny", generator_embed_dim=g["d_model"], generator_layers=g["layers"],
                         generator_heads=g["heads"], generator_ffn_dim=g["ffn"], dropout=g["dropout"],
                         attention_dropout=0.0, activation_dropout=0.0, max_source_positions=g["positions"],
                         max_target_positions=g["positions"], query_encoder="knowledge", generator_init="bart",
                         generator_torch_dropout=(dropout or self.dropout) == "torch")

    def model(self, kind: str, seed: int = 0, dropout: str = ""):
        from rag_plugin.models.rag import RagSequenceModel, RagTokenModel

        torch.manual_seed(seed)
        cls = RagTokenModel if kind == "token" else RagSequenceModel
        return cls.build_model(self.model_config(dropout), self.task)

    def optimizer(self, params) -> torch.optim.Optimizer:
        """Adam at lr 1e-5 over ``params``, as chosen by ``adam`` (see the constructor)."""
        params = [p for p in params if p.requires_grad]
        if self.adam == "fused":
            from rag_plugin.optim.torch_adamw import TorchAdamW, TorchAdamWConfig

            return TorchAdamW(TorchAdamWConfig(lr=[1e-5]), params).optimizer
        return torch.optim.Adam(params, lr=1e-5)

    def n_params(self, model) -> dict:
        return {"total": sum(p.numel() for p in model.parameters()),
                "question_encoder": sum(p.numel() for p in model.query_encoder.parameters()),
                "generator": sum(p.numel() for p in model.generator.parameters())}

    # ------------------------------------------------------------------ training
    def trainer(self, kind: str, t: int, seed: int = 0, dropout: str = ""):
        """A closure running one training step (retrieval inside, forward, backward, Adam) on batch i
        (``dropout``: "fast" or "torch" for this model, default the side's)."""
        from rag_plugin.criterions.marginal_nll import MarginalNLLCriterion

        model = self.model(kind, seed, dropout).train()
        crit = MarginalNLLCriterion(self.task)
        opt = self.optimizer(model.parameters())
        batches = self.batches[t]

        def step(i: int) -> float:
            loss, _, _ = crit(model, batches[i % len(batches)])
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return float(loss.detach())

        step.model = model
        return step

    def step_breakdown(self, kind: str, t: int, steps: int, warmup: int = 2, clock=None) -> dict:
        """Seconds per part of a training step, the step taken apart through the model's own
        pieces: question encoder, retrieval (FAISS search, stored document vectors, scores),
        generator inputs from pre-tokenized passages, BART encoder and decoder, marginal loss,
        backward, Adam. Medians over ``steps`` steps."""
        import statistics
        import time

        from rag_plugin.criterions.marginal_nll import MarginalNLLCriterion
        from rag_plugin.retrieval.index import step_search_threads

        clock = clock or time.perf_counter
        model = self.model(kind).train()
        crit = MarginalNLLCriterion(self.task)
        opt = self.optimizer(model.parameters())
        k = SPEC["n_docs"]
        parts = {}
        for i in range(warmup + steps):
            sample = self.batches[t][i % len(self.batches[t])]
            ni = sample["net_input"]
            marks = [("start", clock())]
            q = model.query_encoder(ni["query_tokens"], ni["query_mask"])
            marks.append(("question_encoder", clock()))
            threads = step_search_threads(model.retriever.knowledge.index, q.size(0), torch.get_num_threads())
            found = model.retriever.search_vectors(q.detach().float().cpu().numpy(), k, threads=threads)
            rows = torch.from_numpy(found.rows)
            d = torch.from_numpy(model.retriever.doc_vectors(found.rows)).to(q.device)
            scores = torch.bmm(d, q.float().unsqueeze(-1)).squeeze(-1) * model.doc_score_scale
            marks.append(("retrieval", clock()))
            src, lengths = model.generator_inputs(ni["src_tokens"], rows)
            marks.append(("generator_inputs", clock()))
            enc = model.generator.encoder(src, src_lengths=lengths)
            marks.append(("bart_encoder", clock()))
            logits, extra = model.generator.decoder(ni["prev_output_tokens"].repeat_interleave(k, 0), encoder_out=enc)
            marks.append(("bart_decoder", clock()))
            extra.update(doc_scores=scores, doc_rows=rows)
            loss, _, _ = crit.compute_loss(model, (logits, extra), sample)
            loss = loss.sum()
            marks.append(("marginal_loss", clock()))
            loss.backward()
            marks.append(("backward", clock()))
            opt.step()
            opt.zero_grad(set_to_none=True)
            marks.append(("adam", clock()))
            if i >= warmup:
                for (_, a), (name, b) in zip(marks, marks[1:]):
                    parts.setdefault(name, []).append(b - a)
        return {name: statistics.median(v) for name, v in parts.items()}

    def bare_generator_trainer(self, t: int, rag):
        """The floor: BART alone on the B*K (question, document) inputs of a RAG step, plain
        cross-entropy, Adam on the generator: no question encoder, retrieval or marginalisation.

        ``rag``: the RAG model being trained beside it (its ``trainer(...).model``). Before each
        step, untimed (``step.prepare(i)``), that model retrieves for the batch exactly as in its
        own training step (train mode: question-encoder dropout on), so the floor runs on inputs
        of the same lengths as the RAG step's, not on those of an eval-mode retrieval.
        """
        generator = copy.deepcopy(rag.generator).train()  # its own weights and optimizer
        opt = self.optimizer(generator.parameters())
        pad = self.task.dictionary.pad()
        k = SPEC["n_docs"]
        batches = self.batches[t]
        state, lengths_seen = {}, []

        def prepare(i: int) -> None:
            b = batches[i % len(batches)]
            ni = b["net_input"]
            with torch.no_grad():
                _, rows = rag.retrieve(ni["query_tokens"], ni["query_mask"], k)
                src, lengths = rag.generator_inputs(ni["src_tokens"], rows)
            lengths_seen.extend(lengths.tolist())
            state["inputs"] = (src, lengths, ni["prev_output_tokens"].repeat_interleave(k, 0),
                               b["target"].repeat_interleave(k, 0))

        def step(i: int) -> float:
            src, lengths, prev, target = state.pop("inputs")
            logits, _ = generator(src, lengths, prev)
            loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), target.view(-1), ignore_index=pad,
                                   reduction="sum")
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return float(loss.detach())

        step.prepare = prepare
        step.input_lengths = lengths_seen
        return step

    # ------------------------------------------------------------------ generation
    def generator_fn(self, model, mode: str, device: str = "cpu"):
        """A closure generating for batch i: mode token_greedy | token_beam4 | seq_thorough | seq_fast |
        seq_thorough_all (Thorough that teacher-forces every (hypothesis, document) pair, also those
        whose scores the document's beam already holds: transformers' amount of rescoring). The model
        and the batches are moved to ``device``."""
        from fairseq import utils
        from fairseq.dataclass.configs import GenerationConfig

        beam = 1 if mode == "token_greedy" else 4
        n = SPEC["new_tokens"]  # n decoder steps: n - 1 tokens, then </s> (forced)
        self.task.cfg.rag_decoding = "fast" if mode == "seq_fast" else "thorough"
        generator = self.task.build_generator([model], GenerationConfig(beam=beam, max_len_a=0, max_len_b=n - 1,
                                                                        min_len=n - 1))
        if mode == "seq_thorough_all":
            generator.reuse_beam_scores = False
        model.eval().to(device)
        batches = [utils.apply_to_sample(lambda t: t.to(device), b) for b in self.batches[8]]

        def run(i: int):
            return generator.generate([model], batches[i % len(batches)])

        return run
