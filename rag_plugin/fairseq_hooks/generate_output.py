"""Hand the retrieval-augmented task the stream fairseq-generate prints to (command-line path only).

fairseq-generate's ``_main(cfg, output_file)`` prints S/T/H/D/P lines to ``output_file`` (stdout,
or ``--results-path``/generate-<subset>.txt) and hands the task nothing of it; the plugin's Z lines
(the retrieved documents) belong in the same stream, in order. This hook wraps ``_main`` and, while
it runs, ``fairseq.tasks.setup_task``, so that the task it creates is given the stream
(``task.output_stream``). Without the hook (the task used from Python) Z lines go to stdout.
"""
import functools

from fairseq import tasks
from fairseq_cli import generate


def install_generate_output() -> None:
    """Idempotent."""
    plain_main = generate._main
    if getattr(plain_main, "_rag_plugin", False):
        return

    @functools.wraps(plain_main)
    def _main(cfg, output_file):
        plain_setup = tasks.setup_task

        def setup_task(*args, **kwargs):
            task = plain_setup(*args, **kwargs)
            if hasattr(task, "output_stream"):
                task.output_stream = output_file
            return task

        tasks.setup_task = setup_task
        try:
            return plain_main(cfg, output_file)
        finally:
            tasks.setup_task = plain_setup

    _main._rag_plugin = True
    generate._main = _main
