"""fairseq refusing its options, as one line each (read by the command-line path's excepthook, :mod:`.excepthook`).

fairseq checks many options with ``assert`` in its mains, its trainer and its learning-rate schedulers, and some
not at all: a bad combination ends in a traceback whose last line is fairseq's text. Here each failure a user
reaches by options becomes one line naming the option and the fix (:data:`ASSERTIONS`, :data:`OPTION_MESSAGES`);
any other assertion fairseq's own code fails becomes one line too, saying what fairseq asserted and where
(:func:`fairseq_assertion_line`). ``--update-freq`` below 1, which fairseq does not check (a division by zero
later), is refused when the options are parsed (:func:`refuse_bad_update_freq`).
"""
import functools
import linecache
import re
import sys
from pathlib import Path
from typing import Optional, Tuple

from fairseq import options

from rag_plugin.generation.options import REPLACE_UNK
from rag_plugin.util.errors import UserError, exception_chain

#: fairseq's assertions that options reach: (a piece of the asserted text, or of the ``assert`` line when it has
#: no text; the file it is in, or None for any; the one line that replaces the traceback: what, then the fix)
ASSERTIONS = (
    ("Must specify batch size either with --max-tokens or --batch-size", None,
     "no batch size (add --batch-size N, questions a batch, or --max-tokens N, tokens a batch)"),
    ("--path required for generation", None,
     "no checkpoint to generate with (add --path SAVE_DIR/checkpoint_best.pt)"),
    ("--sampling requires --nbest to be equal to --beam", None,
     "--sampling with an --nbest other than --beam (give --nbest the value of --beam, or leave --sampling out)"),
    ("--sampling-topk requires --sampling", None,
     "--sampling-topk without --sampling (add --sampling, or leave --sampling-topk out)"),
    ("--sampling-topp requires --sampling", None,
     "--sampling-topp without --sampling (add --sampling, or leave --sampling-topp out)"),
    ("--temperature must be greater than 0", None, "--temperature must be above 0 (1.0 is the default)"),
    ("Cannot use fp16 and AMP together", None,
     "--fp16 and --amp together (choose one: --amp keeps float32 weights, --fp16 trains in float16)"),
    ("Either --max_update or --lr-period-updates must be set", None,
     "--lr-scheduler cosine needs the length of its period (add --max-update N or --lr-period-updates N)"),
    ("cfg.total_num_update > 0", "polynomial_decay_schedule.py",
     "--lr-scheduler polynomial_decay needs --total-num-update above 0 (the updates its decay spans, usually "
     "--max-update's value)"),
    ("cfg.max_update > 0", "tri_stage_lr_scheduler.py",
     "--phase-ratio of --lr-scheduler tri_stage needs --max-update above 0 (add --max-update N)"),
    ("phase ratios must add up to 1", None, "--phase-ratio must add up to 1 (e.g. --phase-ratio '(0.1, 0.4, 0.5)')"),
    ("please specify steps or phase_ratio", None,
     "--lr-scheduler tri_stage needs its phases (add --phase-ratio '(0.1, 0.4, 0.5)' with --max-update N, or "
     "--warmup-steps, --hold-steps and --decay-steps)"),
    ("Pass-through schedule can only be used with optimizers with their own schedulers", None,
     "--lr-scheduler pass_through needs an optimizer with schedules of its own (--optimizer composite) (choose "
     "another --lr-scheduler: fixed, inverse_sqrt, polynomial_decay, cosine)"),
    ("max_lr must be more than lr", None, "--max-lr of --lr-scheduler triangular must be above --lr"),
    ("self.lr_deacy_period > 0", "step_lr_scheduler.py",
     "--lr-deacy-period of --lr-scheduler step must be above 0 (fairseq spells the option so)"),
    ("self.lr_decay <= 1", "step_lr_scheduler.py", "--lr-decay of --lr-scheduler step must be 1 or less"),
    ("self.min_lr >= 0", "step_lr_scheduler.py", "--min-lr of --lr-scheduler step must be 0 or more"),
    ("self.max_lr > self.min_lr", "step_lr_scheduler.py", "--lr of --lr-scheduler step must be above --min-lr"),
)


def _fairseq_file(filename: str) -> Optional[str]:
    """``filename`` as ``fairseq/...`` or ``fairseq_cli/...`` if it is a file of fairseq's packages, else None."""
    path = Path(filename).resolve()
    for name in ("fairseq", "fairseq_cli"):
        module = sys.modules.get(name)
        if module is not None and getattr(module, "__file__", None):
            root = Path(module.__file__).resolve().parent
            if root in path.parents:
                return path.relative_to(root.parent).as_posix()
    return None


def fairseq_assertion(exc: BaseException) -> Optional[Tuple[str, str]]:
    """(what fairseq asserted: its text, or the ``assert`` line when it has none; where: ``fairseq/file.py:N
    (function)``) if ``exc`` is an :class:`AssertionError` raised by fairseq's own code, else None."""
    if not isinstance(exc, AssertionError) or exc.__traceback__ is None:
        return None
    tb = exc.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    code = tb.tb_frame.f_code
    relative = _fairseq_file(code.co_filename)
    if relative is None:
        return None
    what = " ".join(str(exc).split()) or " ".join(linecache.getline(code.co_filename, tb.tb_lineno).split())
    function = getattr(code, "co_qualname", code.co_name)  # Python 3.11: Class.method
    return what or "assert", f"{relative}:{tb.tb_lineno} ({function})"


def known_assertion_message(exc: BaseException) -> Optional[str]:
    """The one line of :data:`ASSERTIONS` for fairseq's assertion ``exc`` (or one it was raised from), if any."""
    for e in exception_chain(exc):
        found = fairseq_assertion(e)
        if found is None:
            continue
        what, where = found
        for piece, in_file, message in ASSERTIONS:
            if piece in what and (in_file is None or where.split(":", 1)[0].endswith(in_file)):
                return message
    return None


def fairseq_assertion_line(exc: BaseException) -> Optional[Tuple[str, int]]:
    """(one line, exit status) for any other assertion fairseq's own code failed: what it asserted and where;
    status 2 when the text names an option (fairseq refusing the command line), 1 otherwise."""
    found = fairseq_assertion(exc)
    if found is None:
        return None
    what, where = found
    if len(what) > 200:
        what = what[:197] + "..."
    status = 2 if re.search(r"(^|\W)--[a-z]", what) else 1
    return f"fairseq's assertion failed at {where}: {what}", status


def missing_accelerator_message(exc: BaseException) -> Optional[str]:
    """A one-line message if fairseq failed for want of the accelerator an option asks for:
    ``--fp16`` puts the optimizer's flat float32 master weights on CUDA, ``--tpu`` needs torch_xla;
    without them fairseq stops with an assertion or an attribute error deep in its trainer.
    (``--bf16`` no longer implies ``--tpu``: :mod:`rag_plugin.fairseq_hooks.mixed_precision`.)"""
    for e in exception_chain(exc):
        if isinstance(e, AssertionError) and "not compiled with CUDA" in str(e):
            return ("--fp16 needs CUDA, which this torch build lacks: fairseq keeps the flat float32 master weights on "
                    "the GPU (on the CPU leave --fp16 out and train in float32)")
        if isinstance(e, AttributeError) and "xla_device" in str(e):
            return ("--tpu needs torch_xla, which is not installed (for bfloat16 on a GPU or the CPU give --bf16 "
                    "without --tpu)")
    return None


def unsupported_option_message(exc: BaseException) -> Optional[str]:
    """A one-line message if fairseq-generate failed on an option that rag_plugin does not support
    before the plugin could refuse it: ``--replace-unk`` stops at fairseq's assertion that the
    dataset is raw text, or (``--dataset-impl raw``) in ``load_align_dict`` opening a file named
    after the option's value (``@@ `` when given without one)."""
    for e in exception_chain(exc):
        if isinstance(e, AssertionError) and "--replace-unk requires" in str(e):
            return f"{REPLACE_UNK[0]} ({REPLACE_UNK[1]})"
        tb = e.__traceback__
        while isinstance(e, OSError) and tb is not None:
            if tb.tb_frame.f_code.co_name == "load_align_dict":
                return f"{REPLACE_UNK[0]} ({REPLACE_UNK[1]})"
            tb = tb.tb_next
    return None


def resume_mismatch_message(exc: BaseException) -> Optional[str]:
    """A one-line message if fairseq's resume refused the checkpoint's optimizer state because another optimizer or
    criterion wrote it: a run that switches between float32 and ``--fp16``/``--bf16``/``--amp`` (each wraps the
    optimizer in another class) stops at fairseq's assertion with "Optimizer does not match ... A vs B"."""
    for e in exception_chain(exc):
        text = str(e)
        if isinstance(e, AssertionError) and "does not match; please reset the optimizer" in text:
            what = "optimizer" if text.startswith("Optimizer") else "criterion"
            names = text.rsplit(". ", 1)[-1]
            return (f"the checkpoint's optimizer state was written with another {what} than this run's ({names}; "
                    f"--fp16, --bf16 and --amp each wrap the optimizer) (fix: resume with the options that wrote it, "
                    f"or add --reset-optimizer to keep the weights and start the optimizer afresh)")
    return None


#: fairseq's ValueErrors that refuse options, with the fix to add: (a piece of the text, the fix)
VALUE_ERROR_FIXES = (
    ("does not exist", "give --finetune-from-model the path of an existing checkpoint"),
    ("--finetune-from-model can not be set together with", "leave the --reset-* options out with "
                                                           "--finetune-from-model (it resets them itself)"),
    ("--finetune-from-model and --restore-file", "give one of --finetune-from-model and --restore-file"),
    ("Cannot combine --fp16 and --tpu", "leave --tpu out (for bfloat16 give --bf16)"),
)


def option_value_error_message(exc: BaseException) -> Optional[str]:
    """One line for a ValueError raised by fairseq's own code whose text names an option (fairseq refusing the
    command line with ``raise ValueError``, e.g. ``--finetune-from-model PATH does not exist``), with the fix where
    :data:`VALUE_ERROR_FIXES` knows it."""
    for e in exception_chain(exc):
        if not isinstance(e, ValueError) or e.__traceback__ is None:
            continue
        tb = e.__traceback__
        while tb.tb_next is not None:
            tb = tb.tb_next
        text = " ".join(str(e).split())
        if _fairseq_file(tb.tb_frame.f_code.co_filename) is None or not re.search(r"(^|\W)--[a-z]", text):
            continue
        fix = next((f for piece, f in VALUE_ERROR_FIXES if piece in text), None)
        return f"{text} (fix: {fix})" if fix else text
    return None


#: fairseq failures that are bad options, each turned into one line (exit 2) by the excepthook; an assertion
#: fairseq failed that none of them knows is one line too (:func:`fairseq_assertion_line`)
OPTION_MESSAGES = (missing_accelerator_message, unsupported_option_message, resume_mismatch_message,
                   known_assertion_message, option_value_error_message)


def refuse_bad_update_freq() -> None:
    """Patch fairseq's ``options.parse_args_and_arch``: an ``--update-freq`` value below 1 is a one-line error
    (fairseq takes it and divides by it when training starts). Idempotent."""
    plain = options.parse_args_and_arch
    if getattr(plain, "_rag_plugin_update_freq", False):
        return

    @functools.wraps(plain)
    def parse_args_and_arch(parser, input_args=None, parse_known=False, suppress_defaults=False,
                            modify_parser=None):
        result = plain(parser, input_args, parse_known, suppress_defaults, modify_parser)
        args = result[0] if parse_known else result
        freq = getattr(args, "update_freq", None)
        if freq is not None and any(int(n) < 1 for n in freq):
            given = ",".join(str(n) for n in freq)
            raise UserError(f"--update-freq {given}: each value must be 1 or more",
                            fix="--update-freq N sums the gradients of N batches into one update; 1 updates after "
                                "every batch")
        return result

    parse_args_and_arch._rag_plugin_update_freq = True
    options.parse_args_and_arch = parse_args_and_arch
