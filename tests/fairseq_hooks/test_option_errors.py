"""rag_plugin.fairseq_hooks.option_errors: fairseq refusing its options ends rag-train / rag-generate with one
line naming the option and the fix, not fairseq's AssertionError traceback; any other assertion of fairseq's
own code is one line saying what it asserted and where; rag-train prints no log line of fairseq's import
("Please install tensorboardX")."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rag_plugin.fairseq_hooks import option_errors
from tests.conftest import assert_one_line_error

BIN = Path(sys.executable).parent
ENV = dict(os.environ, OMP_NUM_THREADS="1")


def _command(name, world, tmp_path, *extra):
    args = [str(world["data"]), "--task", "retrieval_augmented", "--knowledge", str(world["ks"]), "--cpu",
            "--num-workers", "0", *extra]
    return subprocess.run([str(BIN / name), *args], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env=ENV)


def _train(world, tmp_path, *extra):
    return _command("rag-train", world, tmp_path, "--arch", "rag_token_tiny", "--criterion", "marginal_nll",
                    "--n-docs", "2", "--optimizer", "adam", "--lr", "1e-3", "--no-progress-bar",
                    "--disable-validation", "--no-save", "--save-dir", str(tmp_path / "ckpt"), *extra)


def _the_line(proc, status=2):
    """The one ``error:`` line of a command that stopped on it (exit ``status``), without a traceback."""
    if status == 2:
        assert_one_line_error(proc)
    assert proc.returncode == status, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return lines[0]


def test_rag_train_without_a_batch_size_is_one_line_and_prints_no_import_noise(tiny_world, tmp_path):
    proc = _train(tiny_world, tmp_path, "--max-update", "1")
    assert _the_line(proc) == ("error: no batch size (add --batch-size N, questions a batch, or --max-tokens N, "
                               "tokens a batch)")
    assert "tensorboardX" not in proc.stdout + proc.stderr
    assert "| INFO | rag_plugin.fairseq_hooks.threads | torch threads" in proc.stdout  # fairseq's log format


def test_update_freq_below_one_is_refused_when_parsed(tiny_world, tmp_path):
    proc = _train(tiny_world, tmp_path, "--batch-size", "8", "--update-freq", "2,0")
    assert _the_line(proc) == ("error: --update-freq 2,0: each value must be 1 or more (--update-freq N sums the "
                               "gradients of N batches into one update; 1 updates after every batch)")


def test_a_scheduler_without_its_options_is_one_line(tiny_world, tmp_path):
    proc = _train(tiny_world, tmp_path, "--batch-size", "8", "--lr-scheduler", "cosine")
    assert _the_line(proc) == ("error: --lr-scheduler cosine needs the length of its period (add --max-update N or "
                               "--lr-period-updates N)")


def test_rag_generate_without_a_checkpoint_is_one_line(tiny_world, tmp_path):
    proc = _command("rag-generate", tiny_world, tmp_path, "--batch-size", "4", "--gen-subset", "test")
    assert _the_line(proc) == "error: no checkpoint to generate with (add --path SAVE_DIR/checkpoint_best.pt)"
    assert "tensorboardX" not in proc.stdout + proc.stderr


def _fairseq_sources():
    import fairseq
    import fairseq_cli

    for package in (fairseq, fairseq_cli):
        for path in Path(package.__file__).parent.rglob("*.py"):
            yield path, path.read_text(errors="replace")


def test_every_known_assertion_is_in_the_installed_fairseq_and_every_line_names_an_option():
    """The table cannot drift from fairseq: each piece occurs in the file it names (or in some file)."""
    sources = list(_fairseq_sources())
    for piece, in_file, message in option_errors.ASSERTIONS:
        hits = [path.name for path, text in sources if piece in text and (in_file is None or path.name == in_file)]
        assert hits, piece
        assert "--" in message and "\n" not in message, message


def _raise_from(filename, code, kind=AssertionError):
    """The ``kind`` exception ``code`` raises, compiled as if it were the file ``filename``."""
    try:
        exec(compile(code, filename, "exec"), {})
    except kind as exc:
        return exc
    raise AssertionError("nothing raised")


def test_an_unknown_fairseq_assertion_says_what_and_where():
    import fairseq
    from fairseq import utils

    with pytest.raises(AssertionError) as bare:
        utils.set_torch_seed("not an int")  # fairseq/utils.py: a bare `assert isinstance(seed, int)`
    line, status = option_errors.fairseq_assertion_line(bare.value)
    assert line.startswith("fairseq's assertion failed at fairseq/utils.py:") and status == 1, line
    function = "set_torch_seed.__init__" if sys.version_info >= (3, 11) else "__init__"
    assert line.endswith(f" ({function}): assert isinstance(seed, int)"), line
    fake = str(Path(fairseq.__file__).parent / "not_a_module.py")  # raised from a file of fairseq's package
    line, status = option_errors.fairseq_assertion_line(_raise_from(fake, "assert False, '--frobnicate  too big'"))
    assert line == "fairseq's assertion failed at fairseq/not_a_module.py:1 (<module>): --frobnicate too big"
    assert status == 2  # names an option: fairseq refusing the command line
    assert option_errors.fairseq_assertion_line(_raise_from(__file__, "assert False, '--x'")) is None  # not fairseq's
    assert option_errors.known_assertion_message(bare.value) is None


def test_the_excepthook_ends_an_unknown_fairseq_assertion_with_one_line():
    code = ("from rag_plugin.util.quiet_import import import_fairseq_quietly\nimport_fairseq_quietly()\n"
            "import rag_plugin\nfrom rag_plugin import fairseq_hooks\nrag_plugin.register()\n"
            "assert fairseq_hooks.install()\nfrom fairseq import utils\nutils.set_torch_seed('x')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=ENV)
    line = _the_line(proc, status=1)
    assert line.startswith("error: fairseq's assertion failed at fairseq/utils.py:"), line


def test_a_missing_finetune_checkpoint_is_one_line_with_its_fix(tiny_world, tmp_path):
    """fairseq refuses --finetune-from-model with a ValueError (a traceback before): one line, the fix added."""
    missing = tmp_path / "none.pt"
    proc = _train(tiny_world, tmp_path, "--batch-size", "8", "--max-update", "1", "--finetune-from-model", str(missing))
    assert _the_line(proc) == (f"error: --finetune-from-model {missing} does not exist (fix: give "
                               f"--finetune-from-model the path of an existing checkpoint)")


def _value_error_from(filename, code):
    return _raise_from(filename, code, ValueError)


def test_fairseqs_value_errors_naming_an_option_are_one_line_and_the_known_fixes_are_in_fairseq():
    import fairseq

    fake = str(Path(fairseq.__file__).parent / "not_a_module.py")
    assert option_errors.option_value_error_message(
        _value_error_from(fake, "raise ValueError('--frobnicate  is bad')")) == "--frobnicate is bad"
    assert option_errors.option_value_error_message(
        _value_error_from(fake, "raise ValueError('Cannot combine --fp16 and --tpu, use --bf16 on TPUs')")) == (
        "Cannot combine --fp16 and --tpu, use --bf16 on TPUs (fix: leave --tpu out (for bfloat16 give --bf16))")
    assert option_errors.option_value_error_message(_value_error_from(fake, "raise ValueError('no option')")) is None
    assert option_errors.option_value_error_message(  # not fairseq's code
        _value_error_from(__file__, "raise ValueError('--x is bad')")) is None
    sources = [text for _, text in _fairseq_sources()]
    for piece, _ in option_errors.VALUE_ERROR_FIXES:
        assert any(piece in text and "ValueError" in text for text in sources), piece
