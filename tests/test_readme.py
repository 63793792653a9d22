"""README.md cannot drift from the code: every command of its shell blocks is checked here, and every relative
link of README.md and docs/*.md points to a file (and a heading) that exists.

A command is either
* a console script of ``setup.py`` or a ``python PATH.py`` script: run here with ``--help`` (``rag-train`` /
  ``rag-generate`` with the line's ``--task``, ``--arch``, ``--criterion``, ... so that fairseq lists their
  options), which must exit 0 and name every option the README shows; or
* in :data:`ALLOWED`, with the file that runs it, which must exist and hold the command's script name.
Anything else (an unknown program, a script ``setup.py`` no longer has, a continuation line that does not
continue) is a problem. The README's Python blocks must compile and their imports resolve. The shell blocks of
docs/*.md are held to the same rule for the console scripts they name (other programs there, fairseq-train or
torchrun, are not run). Each check is first shown to fail on a README of its own with the mistake in it.
"""
import ast
import importlib
import inspect
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Dict, Iterator, List, NamedTuple, Optional, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"

#: commands not run here, by their first words: (the file that runs them, what that file must contain)
ALLOWED: Dict[str, Tuple[str, str]] = {
    "make demo": ("Makefile", "examples/demo/run_demo.py"),      # the demo; tests/examples/test_run_demo.py
    "make test": ("Makefile", "pytest -q tests"),                # this suite
    "pip install -e": ("scripts/bootstrap.sh", '-e ".[test]"'),   # what make's set-up runs
}
#: help read beside the shell blocks' for the options the prose names: the demo's flags, torchrun's (scaling-out.md)
EXTRA_HELP = (("python", "examples/demo/run_demo.py", "--help"), ("torchrun", "--help"))
#: programs run by their module where no console script of setup.py is theirs
MODULES = {"torchrun": "torch.distributed.run:main"}
#: options of rag-train / rag-generate whose values change what fairseq's --help lists
HELP_CONTEXT = ("--task", "--arch", "--criterion", "--optimizer", "--lr-scheduler")
#: console scripts whose first positional argument selects a sub-command with options of its own
SUBCOMMANDS = ("rag-prepare",)
SHELL_LANGS = ("bash", "sh", "shell", "console")
SEPARATORS = ("|", "||", "&&", ";")
REDIRECTS = re.compile(r"^\d*(>>?|<)(&\d+)?")


class Command(NamedTuple):
    source: str      # "README.md:12"
    words: List[str]


# ------------------------------------------------------------------------------------------------- reading


def fenced_blocks(text: str, langs: Tuple[str, ...]) -> Iterator[Tuple[int, List[str]]]:
    """(line number of the block's first line, its lines) of each fenced block whose language is in ``langs``;
    fences may be indented (a block inside a list item)."""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^(\s*)(```+)\s*(\S*)", lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang = m.groups()
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence):
            j += 1
        if lang in langs:
            yield i + 2, [line[len(indent):] if line.startswith(indent) else line.lstrip() for line in lines[i + 1:j]]
        i = j + 1


def logical_lines(first: int, lines: List[str]) -> Iterator[Tuple[int, str]]:
    """The block's command lines, continuations (a line ending in a backslash) joined, comment lines left out."""
    start, parts = None, []
    for n, line in enumerate(lines, first):
        if not parts and (not line.strip() or line.lstrip().startswith("#")):
            continue
        start = n if not parts else start
        if line.rstrip().endswith("\\"):
            parts.append(line.rstrip()[:-1])
            continue
        parts.append(line)
        yield start, " ".join(parts)
        parts = []
    if parts:
        yield start, " ".join(parts)


def split_commands(words: List[str]) -> List[List[str]]:
    """The commands of a pipeline or list (``a | b``, ``a && b``), redirections dropped; a ``|`` inside a
    ``[...]`` group is an alternative of the usage notation, not a pipe."""
    commands, current, depth, skip = [], [], 0, False
    for w in words:
        if skip:
            skip = False
            continue
        if depth == 0 and w in SEPARATORS:
            commands.append(current)
            current = []
            continue
        if depth == 0 and REDIRECTS.match(w):
            skip = REDIRECTS.fullmatch(w) is not None and not w.endswith(tuple("0123456789"))
            continue
        depth += w.count("[") - w.count("]")
        current.append(w)
    commands.append(current)
    return [c for c in commands if c]


def shell_commands(text: str, source: str) -> List[Command]:
    """Every command of ``text``'s shell blocks, environment assignments (``OMP_NUM_THREADS=1``) dropped."""
    found = []
    for first, lines in fenced_blocks(text, SHELL_LANGS):
        for n, line in logical_lines(first, lines):
            for words in split_commands(shlex.split(line, comments=True)):
                while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):
                    words = words[1:]
                if words:
                    found.append(Command(f"{source}:{n}", words))
    return found


def console_scripts(setup_py: Path = ROOT / "setup.py") -> Dict[str, str]:
    """name -> "module:function" of setup.py's CONSOLE_SCRIPTS (read, not run)."""
    for node in ast.walk(ast.parse(setup_py.read_text())):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "CONSOLE_SCRIPTS" for t in node.targets):
            entries = ast.literal_eval(node.value)
            return {name.strip(): target.strip() for name, target in (e.split("=", 1) for e in entries)}
    raise AssertionError(f"{setup_py}: no CONSOLE_SCRIPTS")


def options_shown(words: List[str]) -> List[str]:
    """The options a command line shows (``--n-docs``, ``-k``), also inside ``[...]`` groups."""
    found = []
    for w in words[1:]:
        w = w.strip("[]")
        m = re.fullmatch(r"(--[A-Za-z0-9][\w-]*)(=.*)?|(-[A-Za-z])", w)
        if m and (m.group(1) or m.group(3)) not in found:
            found.append(m.group(1) or m.group(3))
    return found


# ------------------------------------------------------------------------------------------------- running


def help_call(words: List[str], scripts: Dict[str, str], root: Path) -> Optional[Tuple[str, ...]]:
    """The ``--help`` invocation that lists the options of ``words``: (program, arguments...), or None where
    ``words`` is neither a console script nor a ``python`` script."""
    program, args = words[0], words[1:]
    if program in ("python", "python3") and args and args[0].endswith(".py"):
        return ("python", args[0], "--help")
    if program not in scripts:
        return None
    extra: List[str] = []
    if program in SUBCOMMANDS and args and not args[0].startswith(("-", "[")) and not args[0].isupper():
        extra.append(args[0])
    if program in ("rag-train", "rag-generate"):
        values = dict(zip(args, args[1:]))
        extra += ["--task", values.get("--task", "retrieval_augmented")]
        for option in HELP_CONTEXT[1:]:
            if option in values and not values[option].startswith(("-", "[")) and not values[option].isupper():
                extra += [option, values[option]]
    return (program, *extra, "--help")


#: runs console scripts' functions with the arguments given, one after the other, in one process (fairseq and
#: torch imported once): a JSON list of [argv0, module, function, [args...]] on stdin, [exit status, output] out
DRIVER = """
import contextlib, importlib, io, json, sys, traceback
results = []
for name, module, function, args in json.load(sys.stdin):
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        sys.argv = [name, *args]
        try:
            rc = getattr(importlib.import_module(module), function)() or 0
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:
            rc = 1
            traceback.print_exc()
    results.append([rc, out.getvalue()])
sys.__stdout__.write(json.dumps(results))
"""
_HELP_CACHE: Dict[Tuple[str, Tuple[str, ...]], Tuple[int, str]] = {}


Help = Tuple[str, ...]


def run_helps(calls: List[Help], scripts: Dict[str, str], root: Path) -> Dict[Help, Tuple[int, str]]:
    """(exit status, output) of each help invocation, through the console script's own function (installed or
    not): the console scripts in one process, ``python PATH --help`` each in its own; cached per tree."""
    env = {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(root), "PATH": "/usr/bin:/bin", "COLUMNS": "200"}
    todo = [c for c in dict.fromkeys(calls) if (str(root), c) not in _HELP_CACHE]
    for call in [c for c in todo if c[0] == "python"]:
        proc = subprocess.run([sys.executable, str(root / call[1]), *call[2:]], cwd=root, env=env,
                              capture_output=True, text=True, timeout=120)
        _HELP_CACHE[str(root), call] = proc.returncode, proc.stdout + proc.stderr
    batch = [c for c in todo if c[0] != "python"]
    if batch:
        jobs = [[c[0], *{**MODULES, **scripts}[c[0]].split(":"), list(c[1:])] for c in batch]
        proc = subprocess.run([sys.executable, "-c", DRIVER], input=json.dumps(jobs), cwd=root, env=env,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
        for call, (rc, out) in zip(batch, json.loads(proc.stdout)):
            _HELP_CACHE[str(root), call] = rc, out
    return {c: _HELP_CACHE[str(root), c] for c in calls}


def allowed_problems(command: Command, root: Path) -> Optional[List[str]]:
    """None where no ALLOWED entry covers ``command``, else what is wrong with the entry that does."""
    text = " ".join(command.words)
    for prefix, (runner, needle) in ALLOWED.items():
        if text == prefix or text.startswith(prefix + " "):
            path = root / runner
            if not path.is_file():
                return [f"{command.source}: `{text}` is said to be run by {runner}, which does not exist"]
            if needle not in path.read_text():
                return [f"{command.source}: `{text}` is said to be run by {runner}, which no longer holds `{needle}`"]
            return []
    return None


def command_problems(commands: List[Command], root: Path, strict: bool = True) -> List[str]:
    """What is wrong with ``commands``: run each distinct help invocation once (in parallel) and compare.
    ``strict``: a command that is neither checked here nor in ALLOWED is a problem (the README); otherwise it is
    left alone (docs/ pages: fairseq-train, torchrun, ...)."""
    scripts = console_scripts(root / "setup.py")
    problems, checks = [], []
    for command in commands:
        program = command.words[0]
        if program.startswith("-"):
            problems.append(f"{command.source}: `{' '.join(command.words)}` starts with an option: a line above "
                            "it does not continue (a comment after its backslash?)")
            continue
        call = help_call(command.words, scripts, root)
        if call is not None:
            if call[0] == "python" and not (root / call[1]).is_file():
                problems.append(f"{command.source}: {call[1]} does not exist")
            else:
                checks.append((command, call))
            continue
        if program.startswith("rag-"):
            problems.append(f"{command.source}: `{program}` is not a console script of setup.py")
            continue
        covered = allowed_problems(command, root)
        if covered is not None:
            problems += covered
        elif strict:
            problems.append(f"{command.source}: `{' '.join(command.words)}` is neither run by tests/test_readme.py "
                            "nor in its ALLOWED list")
    outputs = run_helps([call for _, call in checks], scripts, root)
    for command, call in checks:
        rc, out = outputs[call]
        if rc != 0:
            problems.append(f"{command.source}: `{' '.join(call)}` exits {rc}: {out.strip()[-300:]}")
            continue
        for option in options_shown(command.words):
            if option != "-h" and not re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", out):
                problems.append(f"{command.source}: {command.words[0]} shows {option}, "
                                f"which `{' '.join(call)}` does not list")
    return problems


def python_problems(text: str, source: str) -> List[str]:
    """The Python blocks of ``text`` compile, their imports resolve, and ``Name.attr`` of an imported name exists."""
    problems = []
    for first, lines in fenced_blocks(text, ("python",)):
        code = "\n".join(lines)
        try:
            tree = ast.parse(code)
        except SyntaxError as e:
            problems.append(f"{source}:{first}: the Python block does not compile: {e}")
            continue
        names = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    try:
                        names[alias.asname or alias.name] = getattr(importlib.import_module(node.module), alias.name)
                    except (ImportError, AttributeError) as e:
                        problems.append(f"{source}:{first}: from {node.module} import {alias.name}: {e}")
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in names:
                if not hasattr(names[node.value.id], node.attr):
                    problems.append(f"{source}:{first}: {node.value.id}.{node.attr} does not exist")
            elif isinstance(node, ast.Call):
                problems += [f"{source}:{first}: {name}() takes no {kw}=" for name, kw in unknown_keywords(node, names)]
    return problems


def unknown_keywords(call: ast.Call, names: dict) -> List[Tuple[str, str]]:
    """(function, keyword) of ``call``'s keywords that the function (``Name(...)`` or ``Name.attr(...)`` of an
    imported name) does not take."""
    f = call.func
    if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id in names:
        function, label = getattr(names[f.value.id], f.attr, None), f"{f.value.id}.{f.attr}"
    elif isinstance(f, ast.Name) and f.id in names:
        function, label = names[f.id], f.id
    else:
        return []
    try:
        params = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return []
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return []
    taken = {p.name for p in params}
    return [(label, k.arg) for k in call.keywords if k.arg is not None and k.arg not in taken]


def prose_options(text: str) -> List[str]:
    """The options ``text`` names in backticks outside its code blocks (``--reindex-every N``, ``--fusion-scale``)."""
    prose = re.sub(r"^\s*```.*?^\s*```", "", text, flags=re.S | re.M)
    spans = re.findall(r"`([^`\n]+)`", prose)
    return list(dict.fromkeys(o for span in spans for o in re.findall(r"(?<![\w-])(--[a-z0-9][\w-]*)", span)))


def prose_option_problems(pages: Dict[str, str], root: Path) -> List[str]:
    """Options the prose of ``pages`` (name -> text) names that no help lists: the help of every command of their
    shell blocks, and :data:`EXTRA_HELP`'s."""
    scripts = console_scripts(root / "setup.py")
    calls = [call for name, text in pages.items() for c in shell_commands(text, name)
             if (call := help_call(c.words, scripts, root)) is not None
             and (call[0] != "python" or (root / call[1]).is_file())]
    helps = "\n".join(out for rc, out in run_helps([*calls, *EXTRA_HELP], scripts, root).values())
    return [f"{name}: {option} is named, but no command's --help lists it" for name, text in pages.items()
            for option in prose_options(text) if not re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", helps)]


# --------------------------------------------------------------------------------------------------- links


def heading_anchors(text: str) -> set:
    """GitHub's anchors of ``text``'s headings (outside code blocks): lower case, punctuation dropped, spaces to
    hyphens, a repeated anchor numbered ``-1``, ``-2``, ..."""
    anchors, in_code = set(), False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            in_code = not in_code
            continue
        m = None if in_code else re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            base = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            anchor, n = base, 0
            while anchor in anchors:
                n += 1
                anchor = f"{base}-{n}"
            anchors.add(anchor)
    return anchors


def link_problems(path: Path, root: Path) -> List[str]:
    """Relative links (and images) of the markdown file ``path`` that point to no file, or to no heading."""
    text = path.read_text()
    prose = re.sub(r"^\s*```.*?^\s*```", "", text, flags=re.S | re.M)
    prose = re.sub(r"`[^`\n]*`", "", prose)
    problems = []
    for target in re.findall(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", prose):
        if re.match(r"^[a-z]+:", target):
            continue
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        where = f"{path.relative_to(root)}: link {target}"
        if not linked.exists():
            problems.append(f"{where}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in heading_anchors(linked.read_text()):
            problems.append(f"{where}: {linked.name} has no heading with anchor #{anchor}")
    return problems


REPO_DIRS = ("rag_plugin/", "examples/", "tests/", "benchmarks/", "scripts/", "docs/")


def path_problems(text: str, source: str, root: Path) -> List[str]:
    """Repository paths that ``text`` names in backticks (``rag_plugin/optim/lr_scale.py``, globs allowed) and
    that do not exist."""
    problems = []
    for path in dict.fromkeys(re.findall(r"`([^`\s]+)`", text)):
        path = path.split("::")[0].rstrip("/")
        if path.startswith(REPO_DIRS) and not list(root.glob(path)):
            problems.append(f"{source}: `{path}` does not exist")
    return problems


def tree_problems(text: str, source: str, root: Path) -> List[str]:
    """The package pictures of ``text`` (plain fenced blocks that start with ``rag_plugin/``): every folder and
    ``.py`` / ``.sh`` file they name exists (a file anywhere under the folder of its line)."""
    problems = []
    for first, lines in fenced_blocks(text, ("",)):
        if not lines or lines[0].strip() != "rag_plugin/":
            continue
        folder = None
        for n, line in enumerate(lines[1:], first + 1):
            m = re.match(r"^(  )?(\S+/|\S+\.py)\s", line + " ")
            if m:
                folder = root / ("rag_plugin/" if m.group(1) else "") / m.group(2)
                if not folder.exists():
                    problems.append(f"{source}:{n}: {folder.relative_to(root)} does not exist")
            names = re.findall(r"\b([\w]+\.(?:py|sh))\b", line)
            if folder is not None and folder.is_dir():
                problems += [f"{source}:{n}: {name} is not under {folder.relative_to(root)}"
                             for name in names if not any(folder.rglob(name))]
    return problems


def doc_pages(root: Path) -> List[Path]:
    return sorted((root / "docs").rglob("*.md"))


# --------------------------------------------------------------------------------------------------- tests


def test_every_readme_command_is_checked():
    text = README.read_text()
    commands = shell_commands(text, "README.md")
    assert len(commands) >= 10, commands   # the parser found the README's commands
    problems = command_problems(commands, ROOT) + python_problems(text, "README.md")
    assert not problems, "\n".join(problems)


def test_console_scripts_in_docs_show_options_they_have():
    commands = [c for page in doc_pages(ROOT)
                for c in shell_commands(page.read_text(), str(page.relative_to(ROOT)))]
    problems = command_problems(commands, ROOT, strict=False)
    assert not problems, "\n".join(problems)


def test_options_named_in_prose_exist():
    pages = {str(p.relative_to(ROOT)): p.read_text() for p in [README, *doc_pages(ROOT)]}
    problems = prose_option_problems(pages, ROOT)
    assert not problems, "\n".join(problems)


def test_links_of_readme_and_docs_exist():
    problems = [p for page in [README, *doc_pages(ROOT)] for p in link_problems(page, ROOT)]
    assert not problems, "\n".join(problems)


def test_paths_and_package_pictures_of_readme_and_docs_exist():
    problems = [p for page in [README, *doc_pages(ROOT)] for p in
                path_problems(page.read_text(), str(page.relative_to(ROOT)), ROOT)
                + tree_problems(page.read_text(), str(page.relative_to(ROOT)), ROOT)]
    assert not problems, "\n".join(problems)


def test_readme_is_short_and_links_every_docs_page():
    text = README.read_text()
    assert len(text.splitlines()) <= 400
    unlinked = [p.name for p in doc_pages(ROOT) if f"(docs/{p.relative_to(DOCS)})" not in text]
    assert not unlinked, f"docs pages the README's contents do not link: {unlinked}"


# ------------------------------------------------------------------------- the checks fail where they should


@pytest.fixture
def tree(tmp_path):
    """A repository of its own: this setup.py, Makefile and scripts/bootstrap.sh, and a README to spoil."""
    for name in ("setup.py", "Makefile", "scripts/bootstrap.sh"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text((ROOT / name).read_text())
    (tmp_path / "rag_plugin").symlink_to(ROOT / "rag_plugin")
    return tmp_path


def _problems(tree: Path, block: str) -> List[str]:
    (tree / "README.md").write_text(f"# x\n```bash\n{block}\n```\n")
    return command_problems(shell_commands((tree / "README.md").read_text(), "README.md"), tree)


def test_a_good_readme_passes(tree):
    assert _problems(tree, "make demo\nrag-search --knowledge KS -k 3 --query 'q?' > /dev/null\n"
                           "rag-evaluate --gold g --guess h [--metrics em,f1 | --task qa]") == []


def test_an_option_the_script_does_not_have_fails(tree):
    problems = _problems(tree, "rag-search --knowledge KS --no-such-option 3")
    assert len(problems) == 1 and "--no-such-option" in problems[0] and "README.md:3" in problems[0], problems


def test_an_option_of_another_subcommand_fails(tree):
    assert _problems(tree, "rag-prepare nq --train a.csv --out d") == []
    problems = _problems(tree, "rag-prepare nq --train a.csv --two-way --out d")   # FEVER's option
    assert len(problems) == 1 and "--two-way" in problems[0], problems


def test_a_console_script_that_is_gone_fails(tree):
    problems = _problems(tree, "rag-frobnicate --knowledge KS")
    assert problems == ["README.md:3: `rag-frobnicate` is not a console script of setup.py"]


def test_an_unlisted_program_or_a_missing_script_fails(tree):
    problems = _problems(tree, "frobnicate --fast\npython examples/nowhere.py --x 1")
    assert "neither run by" in problems[0] and "examples/nowhere.py does not exist" in problems[1], problems


def test_an_allowed_command_whose_runner_changed_fails(tree):
    (tree / "Makefile").write_text("demo:\n\techo nothing\n")
    problems = _problems(tree, "make demo")
    assert len(problems) == 1 and "no longer holds" in problems[0], problems


def test_a_comment_after_a_backslash_fails(tree):
    problems = _problems(tree, "rag-leaderboard --gold g \\   # a comment ends the line\n    --system a=b.txt")
    assert len(problems) == 1 and "does not continue" in problems[0], problems


def test_a_python_block_with_a_name_that_is_gone_fails(tmp_path):
    text = "```python\nfrom rag_plugin.util.errors import UserError\nUserError.no_such_method()\n```\n"
    assert python_problems(text, "R") == ["R:2: UserError.no_such_method does not exist"]
    assert python_problems("```python\nfrom rag_plugin.util.errors import Nope\n```\n", "R")
    call = "```python\nfrom rag_plugin.util.errors import UserError\nUserError('m', path='p', fixx='f')\n```\n"
    assert python_problems(call, "R") == ["R:2: UserError() takes no fixx="]


def test_a_broken_link_or_anchor_fails(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A page\n## Some `code` here: too\n```bash\n# not a heading\n```\n")
    good = "[a](docs/a.md) [b](docs/a.md#a-page) [c](docs/a.md#some-code-here-too) [d](#top) ![i](docs/a.md)\n# Top\n"
    (tmp_path / "README.md").write_text(good + "`[x](nowhere.md)` [web](https://example.org)\n")
    assert link_problems(tmp_path / "README.md", tmp_path) == []
    (tmp_path / "README.md").write_text(good + "[x](docs/b.md) [y](docs/a.md#not-a-heading)\n")
    problems = link_problems(tmp_path / "README.md", tmp_path)
    assert len(problems) == 2 and "no such file" in problems[0] and "#not-a-heading" in problems[1], problems


def test_a_path_or_a_package_picture_that_moved_fails(tmp_path):
    (tmp_path / "rag_plugin" / "core").mkdir(parents=True)
    (tmp_path / "rag_plugin" / "core" / "scores.py").write_text("")
    picture = "```\nrag_plugin/\n  core/        scores.py, marginalization.py\n  training/    reindex.py\n```\n"
    assert path_problems("`rag_plugin/core/scores.py` `rag_plugin/core/*.py` `KS_DIR/x`", "R", tmp_path) == []
    assert path_problems("`rag_plugin/training/reindex.py`", "R", tmp_path) == [
        "R: `rag_plugin/training/reindex.py` does not exist"]
    assert tree_problems(picture, "R", tmp_path) == ["R:3: marginalization.py is not under rag_plugin/core",
                                                    "R:4: rag_plugin/training does not exist"]


def test_an_option_in_prose_that_no_command_has_fails(tree):
    (tree / "examples").symlink_to(ROOT / "examples")
    page = "```bash\nrag-search --knowledge KS -k 3\n```\n`--bm25` and `--nprobe 64`, `--updates` (the demo's)\n"
    assert prose_option_problems({"R": page}, tree) == []
    problems = prose_option_problems({"R": page + "and `--reindex-evry 500`\n"}, tree)
    assert problems == ["R: --reindex-evry is named, but no command's --help lists it"]
