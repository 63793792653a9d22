"""Names shared by the models, the criteria and the task: keys of a model's output extras and the capability
attributes a model or criterion declares. Below all three, so that none imports another's module for them."""

#: ``net_output[1][ATTENTION_KEY]``: the reader's cross-attention share of each passage [B, K] (FiD, when asked)
ATTENTION_KEY = "doc_attention_scores"
#: a model class attribute: True when its forward can return :data:`ATTENTION_KEY` (``--retriever-loss adist``)
ATTENTION_CAPABILITY = "cross_attention_doc_scores"
#: a criterion class attribute: True when it adds ``--retriever-loss`` to its loss
CRITERION_CAPABILITY = "adds_retriever_loss"
