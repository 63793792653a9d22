"""The command runner (rag_plugin/pipeline/commands.py): a command is printed as typed, runs as the installed console
script or ``python script``, its output goes to its log with the progress lines echoed condensed, and a failure is one
line naming the log and the command's own error line."""
import sys
from pathlib import Path

import pytest

from rag_plugin.pipeline import commands
from rag_plugin.util.errors import UserError


def test_a_console_script_runs_as_installed_and_a_missing_one_is_one_line():
    argv = commands.console_script("rag-search", "--help").argv()
    assert Path(argv[0]).name == "rag-search" and Path(argv[0]).is_file() and argv[1:] == ["--help"]
    with pytest.raises(UserError, match="command rag-no-such-script not found.*pip install -e"):
        commands.console_script("rag-no-such-script").argv()


def test_a_python_script_is_shown_relative_and_run_with_this_python(tmp_path):
    script = tmp_path / "tools" / "hello.py"
    script.parent.mkdir()
    script.write_text("import sys\nprint('hello', *sys.argv[1:])\n")
    cmd = commands.python_script(script, tmp_path, "a b", "c")
    assert cmd.shown(tmp_path) == "python tools/hello.py 'a b' c"
    assert cmd.argv() == [sys.executable, str(script), "a b", "c"]
    shown = []
    commands.run(cmd, log_file=tmp_path / "logs" / "hello.log", echo=shown.append, cwd=tmp_path)
    assert shown == ["$ python tools/hello.py 'a b' c"]
    assert (tmp_path / "logs" / "hello.log").read_text() == "hello a b c\n"


def test_progress_lines_are_echoed_condensed_and_a_failure_names_its_log_and_error_line(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print('2026 | INFO | train_inner | epoch 001: num_updates 25, loss 7.75, ups 3.1')\n"
                      "print('some other line')\n"
                      "print('error: the knowledge source is gone', flush=True)\n"
                      "raise SystemExit(2)\n")
    shown, log = [], tmp_path / "train.log"
    with pytest.raises(UserError) as err:
        commands.run(commands.python_script(script, tmp_path), log_file=log, progress=commands.condensed,
                     echo=shown.append)
    assert shown[1:] == ["   [train] updates 25, loss 7.75, ups 3.1"]
    assert str(err.value).startswith(f"python train.py failed with exit status 2 (log: {log}): error: the knowledge "
                                      "source is gone")
    assert "some other line" in log.read_text()


def test_stdout_to_its_own_file_and_stderr_to_the_log(tmp_path):
    script = tmp_path / "gen.py"
    script.write_text("import sys\nprint('H-0 answer')\nprint('generated 1/1 questions', file=sys.stderr)\n")
    shown = []
    commands.run(commands.python_script(script, tmp_path), log_file=tmp_path / "gen.log",
                 stdout_file=tmp_path / "out" / "gen.out", progress=commands.generation_progress, echo=shown.append)
    assert (tmp_path / "out" / "gen.out").read_text() == "H-0 answer\n"
    assert (tmp_path / "gen.log").read_text() == "generated 1/1 questions\n"
    assert shown[1:] == ["   generated 1/1 questions"]
