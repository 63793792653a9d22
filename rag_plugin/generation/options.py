"""fairseq-generate options the RAG generators refuse, each with what it does and what to do instead.

Plain data and one check, shared by the task's ``build_generator`` and the command-line error hook
(fairseq-generate trips over ``--replace-unk`` before the task is asked).
"""
from rag_plugin.util.errors import UserError

#: --replace-unk with rag_plugin: (what, what to do); fairseq-generate fails on it before the task sees it
REPLACE_UNK = ("--replace-unk copies source words through an alignment, which RAG does not produce",
               "leave --replace-unk out")

#: fairseq-generate options the RAG generators do not support: option -> (what, what to do)
UNSUPPORTED = {
    "print_alignment": ("--print-alignment needs the attention of a single source sentence; RAG attends over "
                        "several (question, passage) inputs and reports no alignment",
                        "leave --print-alignment out; the Z- lines name the passages an answer drew on"),
    "constraints": ("--constraints (lexically constrained decoding) is not supported by the RAG generators",
                    "leave --constraints out; from Python, build_generator's prefix_allowed_tokens_fn "
                    "constrains the answers"),
    "replace_unk": REPLACE_UNK,
    "print_step": ("--print-step prints the steps of iterative refinement decoders; RAG decodes left to right",
                   "leave --print-step out"),
}


def refuse_unsupported(args) -> None:
    """A one-line :class:`UserError` for the first unsupported option set in ``args``."""
    for option, (message, fix) in UNSUPPORTED.items():
        if getattr(args, option, None):
            raise UserError(message, fix=fix)
