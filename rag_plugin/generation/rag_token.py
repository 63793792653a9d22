"""RAG-Token decoding: fairseq's SequenceGenerator over the marginalised transition."""

from rag_plugin.generation.adapters import RagGeneratorBase, RagTokenSearchModel


class RagTokenGenerator(RagGeneratorBase):
    """Beam search (or greedy with ``--beam 1``, or sampling) for a ``rag_token`` model.

    Every fairseq generation option applies (beam, nbest, lenpen, max-len, sampling,
    prefixes): the search itself is fairseq's. Retrieval and the generator's encoder run
    once per batch; the decoder's cache carries the document dimension.
    """

    variant = "token"

    def __init__(self, task, rag, args, extra_gen_cls_kwargs=None, prefix_allowed_tokens_fn=None):
        super().__init__(rag)
        self.search_model = self.make_search_model(rag)
        self.search = task.build_search([self.search_model], args, extra_gen_cls_kwargs=extra_gen_cls_kwargs,
                                        prefix_allowed_tokens_fn=self._sentence_ids.wrap(prefix_allowed_tokens_fn))
        self.search_model.temperature = float(getattr(self.search, "temperature", 1.0))

    @staticmethod
    def make_search_model(rag):
        """What fairseq's search drives: the marginalised transition."""
        return RagTokenSearchModel(rag)

    def _generate(self, models, sample, **kwargs):
        # fairseq's search takes a sample's "id" for the sentence's row in per-batch buffers (diverse
        # beam search indexes its group overlaps [batch, groups, groups] with it): dataset ids are
        # not rows. Without "id" the rows are 0..B-1; prefix_allowed_tokens_fn still sees the ids.
        self._sentence_ids.set(sample)
        search_sample = {key: value for key, value in sample.items() if key != "id"}
        hypos = self.search.generate([self.search_model], search_sample, **kwargs)
        return hypos, self.search_model.encoder.take_retrieval()
