"""Running console scripts from another command (rag-pretrain, rag-choose-k, the worked examples
and the demo): each command is printed as a user would type it, its output goes to a log file (and
its stdout, where asked, to a file of its own), and its progress lines are shown as they come,
condensed. A command that fails is a one-line :class:`UserError` naming its log (and the command's
own error line, when it printed one).

A console script is run as installed (beside this Python, else on PATH): setup.py's entry points are
the only table of them; a script missing there is a one-line error that says to install the plugin."""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, List, Optional, Sequence

from rag_plugin.util.errors import UserError

#: fairseq-train's log lines worth showing while a run goes on, and the values shown of them
TRAINING_PROGRESS = re.compile(r"(train_inner|\| valid on|valid \||done training|WARNING|retrieval collapse)")
SHOWN_VALUES = ("num_updates", "loss", "gold_doc_prob", "top1_share", "ups")


@dataclass(frozen=True)
class Command:
    """A command line: ``program`` is what it is shown as (a console script such as ``rag-train`` or
    ``fairseq-train``, or ``python path/script.py``), ``args`` its arguments; ``prefix`` is what runs it
    when it is not a console script (:func:`python_script`)."""

    program: str
    args: Sequence[str]
    prefix: Sequence[str] = ()

    def argv(self) -> List[str]:
        return [*(self.prefix or [installed_script(self.program)]), *(str(a) for a in self.args)]

    def shown(self, root: Optional[Path] = None) -> str:
        """As a user would type it (in ``root``: the paths under it written relative to it)."""
        text = " ".join([self.program, *(shlex.quote(str(a)) for a in self.args)])
        return text.replace(f"{root}{os.sep}", "") if root is not None else text


def console_script(program: str, *args) -> Command:
    """``program`` (a console script of the plugin or of fairseq) with ``args``."""
    return Command(program, [str(a) for a in args])


def python_script(path: Path, root: Path, *args) -> Command:
    """A script of the repository, shown as ``python <path relative to root> ...``."""
    return Command(f"python {Path(path).relative_to(root)}", [str(a) for a in args], prefix=[sys.executable, str(path)])


def installed_script(program: str) -> str:
    """The console script beside this Python (an installed package's), else on PATH."""
    beside = Path(sys.executable).parent / program
    found = str(beside) if beside.is_file() else shutil.which(program)
    if not found:
        raise UserError(f"command {program} not found (beside {sys.executable} or on PATH)",
                        fix="install the plugin (pip install -e .) so that its console scripts exist")
    return found


def condensed(line: str) -> Optional[str]:
    """A training log line as progress (``updates 25 loss 7.75 gold_doc_prob 0.53 ...``), or None
    for a line that is not progress. Warnings are shown whole."""
    if not TRAINING_PROGRESS.search(line):
        return None
    if "WARNING" in line or "collapse" in line or "done training" in line:
        return line.strip()
    values = dict(re.findall(r"(\w+)[=\s](-?[\d.]+(?:e-?\d+)?)(?=[,|\s]|$)", line))
    kind = "valid" if "valid" in line.split("train_inner")[0] else "train"
    if values.get("doc_entropy", "0") == "0":  # closed book (or one document): no retrieval health to show
        values.pop("top1_share", None)
    shown = [f"{k.replace('num_updates', 'updates')} {values[k]}" for k in SHOWN_VALUES if k in values]
    return f"[{kind}] " + ", ".join(shown) if shown else None


def generation_progress(line: str) -> Optional[str]:
    """rag-generate's progress lines (``generated 64/90 questions (...)``) and warnings, or None."""
    if "WARNING" in line:
        return line.strip()
    found = re.search(r"generated \d+(/\d+)? questions.*", line)
    return found.group(0).strip() if found else None


def last_error_line(log_file: Optional[Path]) -> Optional[str]:
    """The last ``error: ...`` line of a log (the command's own one-line error), if any."""
    if log_file is None or not log_file.is_file():
        return None
    errors = [line.strip() for line in log_file.read_text(errors="replace").splitlines() if line.startswith("error:")]
    return errors[-1] if errors else None


def run(command: Command, log_file: Optional[Path] = None, stdout_file: Optional[Path] = None,
        progress: Optional[Callable[[str], Optional[str]]] = None, echo: Callable[[str], None] = print,
        cwd: Optional[Path] = None) -> None:
    """Run ``command`` (in ``cwd``, default this process's directory) after printing it (``$ ...``). Its
    stderr (and stdout, unless ``stdout_file``) goes to ``log_file``; each such line that ``progress``
    turns into text is echoed, indented. Without ``log_file`` its output goes to the terminal."""
    echo(f"$ {command.shown(cwd)}")
    argv = command.argv()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    for path in (log_file, stdout_file):
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
    with open(stdout_file or os.devnull, "w", encoding="utf-8") as out:
        if log_file is None:
            code = subprocess.run(argv, env=env, cwd=cwd, check=False,
                                  stdout=out if stdout_file else None).returncode
        else:
            code = _run_logged(argv, env, cwd, log_file, out if stdout_file else None, progress, echo)
    if code != 0:
        own = last_error_line(log_file)
        where = f" (log: {log_file})" if log_file else ""
        raise UserError(f"{command.program} failed with exit status {code}{where}" + (f": {own}" if own else ""),
                        fix="fix what the log says and rerun the same command: finished steps are skipped")


def _run_logged(argv, env, cwd, log_file: Path, stdout, progress, echo) -> int:
    with open(log_file, "w", encoding="utf-8") as log:
        proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=stdout if stdout else subprocess.PIPE,
                                stderr=subprocess.STDOUT if not stdout else subprocess.PIPE, text=True,
                                errors="replace")
        stream = proc.stderr if stdout else proc.stdout
        try:
            for line in stream:
                log.write(line)
                log.flush()
                shown = progress(line) if progress else None
                if shown:
                    echo(f"   {shown}")
        except BaseException:
            proc.kill()
            proc.wait()
            raise
        return proc.wait()
