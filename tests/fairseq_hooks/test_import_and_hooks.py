"""Importing the plugin only registers; the command-line hooks exist on the command line only.

* importing ``rag_plugin`` (and its retrieval package, the hub, the converters) after fairseq, and
  ``rag_plugin.register()``, leave the host process as it was: its excepthook, argparse's error
  method, fairseq's checkpoint and option functions, torch.distributed's process-group factory,
  warning filters, log levels and torch's allow-list;
* an interactive interpreter survives a UserError from the hub (it used to be ended by os._exit);
* no module reads another's stack frames;
* fairseq-train's ``--help`` lists the task's and the model's options; ``rag-train`` runs from any
  directory without ``--user-dir``; a wrong ``--user-dir`` is one line.
"""
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

SNAPSHOT = r'''
import argparse, logging, sys, warnings
import torch, torch.distributed as dist
import fairseq
from fairseq import checkpoint_utils, options
from fairseq.file_io import PathManager
import fairseq_cli.generate

def snapshot():
    return {
        "excepthook": sys.excepthook,
        "argparse_error": argparse.ArgumentParser.error,
        "load_checkpoint_to_cpu": checkpoint_utils.load_checkpoint_to_cpu,
        "load_model_ensemble_and_task": checkpoint_utils.load_model_ensemble_and_task,
        "load_checkpoint": checkpoint_utils.load_checkpoint,
        "path_manager_copy": PathManager.copy,
        "parse_args_and_arch": options.parse_args_and_arch,
        "generate_main": fairseq_cli.generate._main,
        "init_process_group": dist.init_process_group,
        "new_group": dist.new_group,
        "warning_filters": list(warnings.filters),
        "hydra_level": logging.getLogger("hydra").level,
        "faiss_level": logging.getLogger("faiss").level,
        "root_handlers": list(logging.getLogger().handlers),
        "safe_globals": list(torch.serialization.get_safe_globals()),
    }

before = snapshot()
import rag_plugin
import rag_plugin.retrieval
import rag_plugin.retrieval.retriever
import rag_plugin.hub
import rag_plugin.conversion.hf_rag
rag_plugin.register()
after = snapshot()
changed = sorted(k for k in before if before[k] != after[k])
print("CHANGED:" + ",".join(changed))
'''


def _python(code: str, cwd=ROOT, stdin=None, extra=()):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, *extra, "-c", code] if code else [sys.executable, *extra], cwd=cwd,
                          env=env, input=stdin, capture_output=True, text=True, timeout=300)


def test_import_and_register_leave_the_host_process_unchanged():
    proc = _python(SNAPSHOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "CHANGED:\n" in proc.stdout or proc.stdout.strip().endswith("CHANGED:"), proc.stdout


def test_the_hooks_are_installed_on_the_command_line_path():
    """The same snapshot, in a process that calls itself fairseq-train: every hook is in place."""
    code = "import sys; sys.argv[0] = 'fairseq-train'\n" + SNAPSHOT
    proc = _python(code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    changed = proc.stdout.strip().split("CHANGED:")[1].split(",")
    for hook in ("excepthook", "argparse_error", "load_checkpoint_to_cpu", "load_model_ensemble_and_task",
                 "load_checkpoint", "path_manager_copy", "parse_args_and_arch", "generate_main", "safe_globals"):
        assert hook in changed, (hook, changed)


def test_an_interactive_interpreter_survives_a_user_error_from_the_hub():
    script = 'from rag_plugin.hub import RAG\nRAG.from_pretrained("/nonexistent.pt")\nprint("alive")\n'
    proc = _python("", stdin=script, extra=("-i",))
    assert "alive" in proc.stdout, (proc.stdout, proc.stderr[-2000:])
    assert "UserError: /nonexistent.pt: checkpoint not found" in proc.stderr
    assert "INFO" not in proc.stderr  # importing fairseq through the hub leaves no log noise (tensorboardX, hydra)
    assert proc.returncode == 0


def test_no_module_reads_stack_frames():
    pattern = re.compile(r"_getframe|f_back|f_locals|inspect\.stack|currentframe")
    hits = [f"{p.relative_to(ROOT)}:{i}" for p in (ROOT / "rag_plugin").rglob("*.py")
            for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1) if pattern.search(line)]
    assert hits == []


def test_fairseq_train_help_lists_the_task_and_model_options(tmp_path):
    proc = subprocess.run([str(BIN / "fairseq-train"), "--user-dir", str(ROOT / "rag_plugin"), "--task",
                           "retrieval_augmented", "--help"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    for option in ("--knowledge", "--n-docs", "--rag-decoding", "--provenance-out",   # the task's
                   "--query-encoder-lr-scale", "--generator-checkpoint", "--freeze-query-encoder"):  # the model's
        assert option in proc.stdout, option


def test_rag_train_runs_anywhere_and_refuses_a_wrong_user_dir(tiny_world, tmp_path):
    args = [str(tiny_world["data"]), "--task", "retrieval_augmented", "--knowledge", str(tiny_world["ks"]),
            "--arch", "rag_token_tiny", "--criterion", "marginal_nll", "--n-docs", "2", "--optimizer", "adam",
            "--lr", "1e-3", "--batch-size", "8", "--max-update", "1", "--save-dir", str(tmp_path / "ckpt"),
            "--cpu", "--num-workers", "0", "--no-progress-bar", "--disable-validation", "--no-save"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run([str(BIN / "rag-train"), *args], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "num_updates" in proc.stdout + proc.stderr
    wrong = subprocess.run([str(BIN / "rag-train"), *args, "--user-dir", "rag_plugin"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=300, env=env)
    assert wrong.returncode == 2
    lines = [line for line in wrong.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: --user-dir rag_plugin is not a folder"), wrong.stderr
    where = subprocess.run([str(BIN / "rag-user-dir")], capture_output=True, text=True, timeout=60)
    assert Path(where.stdout.strip()) == (ROOT / "rag_plugin").resolve()


def test_threads_per_process():
    from rag_plugin.retrieval.threads import threads_per_process

    assert threads_per_process(2, 1) == 2 and threads_per_process(8, 4) == 2 and threads_per_process(2, 4) == 1


def test_fairseq_commands_log_their_threads(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    proc = subprocess.run([str(BIN / "fairseq-train"), "--user-dir", str(ROOT / "rag_plugin"), "--task",
                           "retrieval_augmented", "--help"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, env=dict(env, LOCAL_WORLD_SIZE="2"))
    assert proc.returncode == 0
    cores = len(os.sched_getaffinity(0))
    log = proc.stdout + proc.stderr  # fairseq-train logs to stdout
    assert f"torch threads: {max(1, cores // 2)} per process ({cores} cores, 2 process(es) on this node" in log
