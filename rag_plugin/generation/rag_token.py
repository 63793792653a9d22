"""RAG-Token decoding: fairseq's SequenceGenerator over the marginalised transition."""
from fairseq.tasks import FairseqTask

from rag_plugin.generation.adapters import RagGeneratorBase, RagTokenSearchModel


class RagTokenGenerator(RagGeneratorBase):
    """Beam search (or greedy with ``--beam 1``, or sampling) for a ``rag_token`` model.

    Every fairseq generation option applies (beam, nbest, lenpen, max-len, sampling,
    prefixes): the search itself is fairseq's. Retrieval and the generator's encoder run
    once per batch; the decoder's cache carries the document dimension.
    """

    variant = "token"

    def __init__(self, task, rag, args, extra_gen_cls_kwargs=None):
        super().__init__(rag)
        self.search_model = RagTokenSearchModel(rag)
        self.search = FairseqTask.build_generator(task, [self.search_model], args,
                                                  extra_gen_cls_kwargs=extra_gen_cls_kwargs)
        self.search_model.temperature = float(getattr(self.search, "temperature", 1.0))

    def _generate(self, models, sample, **kwargs):
        hypos = self.search.generate([self.search_model], sample, **kwargs)
        self.last_retrieval = self.search_model.encoder.last
        return hypos
