"""fairseq's argument parsing on the command line: one-line usage errors, and a ``--help`` that
lists the plugin's options (installed on the command-line path only).

* A bad argument to a fairseq command line (``--arch x``, a missing value) is one line,
  ``error: argument --arch/-a: invalid choice: 'x' (did you mean ...?) (see fairseq-train --help)``,
  exit 2, instead of the whole usage text and every registered architecture. Parsers that are not
  fairseq's are left alone.
* ``fairseq-train --user-dir rag_plugin --task retrieval_augmented --help``: fairseq parses twice,
  and its first parse prints the help and exits before the task's, the model's, the criterion's
  and the optimizer's options are added. With the hook, ``--help`` is held back until every one of
  them is in the parser (``--arch rag_token`` is assumed for the listing when the task is
  ``retrieval_augmented`` and no ``--arch`` is given).
"""
import argparse
import functools
import sys

from fairseq import options

from rag_plugin.util.errors import usage_error_message

HELP_FLAGS = ("-h", "--help")


class _ListingDone(Exception):
    """Raised in place of a usage error while the options are collected for ``--help``."""


def install_fairseq_usage_errors() -> None:
    """One-line usage errors for parsers whose ``prog`` starts with ``fairseq``. Idempotent."""
    current = argparse.ArgumentParser.error
    if getattr(current, "_rag_plugin", False):
        return

    def error(parser, message):
        if not str(parser.prog).startswith("fairseq") and not str(parser.prog).startswith("rag-"):
            return current(parser, message)
        stream = sys.__stderr__ or sys.stderr
        stream.write(f"error: {usage_error_message(message)} (see {parser.prog} --help)\n")
        stream.flush()
        sys.exit(2)

    error._rag_plugin = True
    argparse.ArgumentParser.error = error


def _help_arguments(argv):
    """``argv`` without its help flags, with ``--arch rag_token`` for the plugin's task if no arch is named."""
    stripped = [a for a in argv if a not in HELP_FLAGS]
    named_arch = any(a in ("--arch", "-a") or a.startswith("--arch=") for a in stripped)
    if "retrieval_augmented" in stripped and not named_arch:
        stripped += ["--arch", "rag_token"]
    return stripped


def install_full_help() -> None:
    """Make ``--help`` of fairseq's two-pass parsing list every option of the chosen task, model,
    criterion and optimizer. Idempotent."""
    plain = options.parse_args_and_arch
    if getattr(plain, "_rag_plugin", False):
        return

    @functools.wraps(plain)
    def parse_args_and_arch(parser, input_args=None, parse_known=False, suppress_defaults=False,
                            modify_parser=None):
        argv = sys.argv[1:] if input_args is None else list(input_args)
        if not any(a in HELP_FLAGS for a in argv):
            return plain(parser, input_args, parse_known, suppress_defaults, modify_parser)

        def stop(message):  # a missing positional (DATA) is no reason to withhold the help
            raise _ListingDone(message)

        parser.error = stop
        try:
            plain(parser, _help_arguments(argv), True, False, modify_parser)
        except _ListingDone:
            pass
        finally:
            del parser.error
        parser.print_help()
        sys.exit(0)

    parse_args_and_arch._rag_plugin = True
    options.parse_args_and_arch = parse_args_and_arch
