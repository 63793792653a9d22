"""fairseq's checkpoint functions, made safe and explicit (installed on the command-line path only).

* the allow-list of :mod:`rag_plugin.util.safe_load` registered with torch for the whole process, so
  that fairseq's plain ``torch.load`` reads its own checkpoints under ``weights_only=True`` (and the
  tensor placeholders rank 0 broadcasts on a distributed resume);
* a missing, truncated or unreadable checkpoint, or one whose pickle refers to code, is a one-line
  :class:`~rag_plugin.util.errors.UserError` naming the file; an explicit ``--restore-file`` that
  does not exist is an error, not a silent fresh start;
* the copies fairseq makes of a just-saved checkpoint land atomically.
"""
import os
import shutil

import torch
from fairseq import checkpoint_utils
from fairseq.distributed.utils import _TensorPlaceholder
from fairseq.file_io import PathManager

from rag_plugin.util.errors import UserError
from rag_plugin.util.io import atomic_path
from rag_plugin.util.safe_load import checkpoint_load_error, checkpoint_safe_globals


def allow_fairseq_checkpoints() -> None:
    """Register the allow-list with torch (idempotent); fairseq's own loader then works.

    On a distributed resume rank 0 broadcasts the checkpoint with fairseq's tensor
    placeholders, which the other ranks unpickle: allowed too.
    """
    torch.serialization.add_safe_globals(checkpoint_safe_globals() + [_TensorPlaceholder])


def _from_torch_load(tb) -> bool:
    """Whether a traceback went through torch's deserializer (the file, not our code, is bad)."""
    while tb is not None:
        name = tb.tb_frame.f_code.co_filename.replace("\\", "/")
        if name.endswith("torch/serialization.py") or "/torch/_weights_only_unpickler" in name:
            return True
        tb = tb.tb_next
    return False


def _atomic_copyfile(src: str, dst: str) -> str:
    """Copy ``src`` onto ``dst`` through a temporary file beside ``dst`` and a rename."""
    with atomic_path(dst) as tmp:
        shutil.copyfile(src, tmp)
    return dst


def _guarded_load_to_cpu(plain, path_manager):
    def load_checkpoint_to_cpu(path, arg_overrides=None, load_on_all_ranks=False):
        if not os.path.exists(path_manager.get_local_path(path)):
            raise UserError("checkpoint not found", path=str(path), fix="check the path (--path / --restore-file)")
        try:
            return plain(path, arg_overrides, load_on_all_ranks)
        except Exception as err:
            if _from_torch_load(err.__traceback__):
                raise checkpoint_load_error(path, err) from None
            raise

    return load_checkpoint_to_cpu


def _guarded_load_ensemble(plain, path_manager):
    def load_model_ensemble_and_task(filenames, arg_overrides=None, task=None, strict=True, suffix="",
                                     num_shards=1, state=None):
        if state is None and not suffix and num_shards == 1:
            for filename in filenames:
                if not path_manager.exists(filename):
                    raise UserError("checkpoint not found", path=str(filename),
                                    fix="check --path (several checkpoints are separated by ':')")
        return plain(filenames, arg_overrides, task, strict, suffix, num_shards, state)

    return load_model_ensemble_and_task


def _guarded_load_for_training(plain, path_manager):
    def load_checkpoint(cfg, trainer, **passthrough_args):
        restore = getattr(cfg, "restore_file", "checkpoint_last.pt")
        if restore != "checkpoint_last.pt" and not getattr(cfg, "finetune_from_model", None):
            suffix = getattr(trainer, "checkpoint_suffix", "") or ""
            path = restore.replace(".pt", suffix + ".pt") if suffix else restore
            if not path_manager.exists(path):
                raise UserError("--restore-file not found", path=str(path),
                                fix="check the path; leave --restore-file out to resume from "
                                    "SAVE_DIR/checkpoint_last.pt (or start fresh when there is none)")
        return plain(cfg, trainer, **passthrough_args)

    return load_checkpoint


def _atomic_copy(plain, path_manager):
    def copy(src_path: str, dst_path: str, overwrite: bool = False) -> bool:
        if (path_manager.path_requires_pathmanager(src_path) or path_manager.path_requires_pathmanager(dst_path)
                or (not overwrite and os.path.exists(dst_path))):
            return plain(src_path, dst_path, overwrite)
        _atomic_copyfile(src_path, dst_path)
        return True

    return copy


def guard_fairseq_checkpoints() -> None:
    """Wrap fairseq's checkpoint functions so that, for every fairseq command line and
    :mod:`rag_plugin.hub`:

    * a missing, truncated or unreadable checkpoint (``--path``, ``--restore-file``,
      ``checkpoint_last.pt`` on resume) is a one-line :class:`UserError` naming the file;
    * a checkpoint whose pickle refers to code (refused by ``weights_only=True``) is one too;
    * an explicit ``--restore-file`` that does not exist is an error, not a silent fresh start
      (fairseq would train from scratch and then overwrite ``checkpoint_last.pt``);
    * the copies fairseq makes of a just-saved checkpoint (``checkpoint_last.pt``,
      ``checkpoint_best.pt`` beside an epoch checkpoint) land atomically, like the first file
      (fairseq writes that one to ``<name>.tmp`` and renames it; the others it copied in place,
      so a kill during the copy left a truncated ``checkpoint_last.pt``).

    Idempotent.
    """
    if getattr(checkpoint_utils, "_rag_plugin_guarded", False):
        return
    checkpoint_utils.load_checkpoint_to_cpu = _guarded_load_to_cpu(checkpoint_utils.load_checkpoint_to_cpu, PathManager)
    checkpoint_utils.load_model_ensemble_and_task = _guarded_load_ensemble(
        checkpoint_utils.load_model_ensemble_and_task, PathManager)
    checkpoint_utils.load_checkpoint = _guarded_load_for_training(checkpoint_utils.load_checkpoint, PathManager)
    PathManager.copy = staticmethod(_atomic_copy(PathManager.copy, PathManager))
    checkpoint_utils._rag_plugin_guarded = True
