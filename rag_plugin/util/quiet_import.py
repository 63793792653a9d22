"""Import fairseq from library code (the hub, the converters) without keeping what importing it
does to the host process's logging.

fairseq's ``wav2vec2_classification`` module calls ``logging.basicConfig(level=DEBUG)`` when fairseq
is imported: a program that had not configured logging then prints every library's debug and info
messages on stderr (hydra's, tensorboardX's "... not found" notice on every conversion). The root
logger is put back as it was before the import. When fairseq was already imported, nothing is done.
"""
import logging
import sys


def import_fairseq_quietly() -> None:
    if "fairseq" in sys.modules:
        return
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    disabled = logging.root.manager.disable
    logging.disable(logging.INFO)  # the messages logged while importing (e.g. "Please install tensorboardX")
    try:
        import fairseq  # noqa: F401  (start-up: importing fairseq is this function's work, on demand)
    finally:
        logging.disable(disabled)
        for handler in list(root.handlers):
            if handler not in handlers:
                root.removeHandler(handler)
        root.setLevel(level)
