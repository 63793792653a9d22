"""fairseq-train under torch's DistributedDataParallel (``--ddp-backend pytorch_ddp``, fairseq's default
``find_unused_parameters=False``), for every architecture and option family: 3 updates each.

torch's DDP stops at the next forward when a trainable parameter got no gradient ("Expected to have finished
reduction in the prior iteration"), so every case checks the plugin's rule that every trainable part receives a
gradient, or a zero one, in every step (fairseq's ``legacy_ddp``, which the other CPU tests use, fills zeros in
and never complains). One process, a world of one gloo rank: torch's DDP checks the same at any world size
(verified: an unused parameter fails at update 2 here, as it did for FiD + adist + --retriever-loss-start before
rag_plugin/criterions/retriever_loss.py gave it a zero-weighted term), and one process runs all the cases, each
``fairseq_cli.train.main`` over its own command line. fairseq wraps a model only when its world is larger than
one, so the test-only driver (written into tmp_path) makes ``Trainer.use_distributed_wrapper`` true; the wrapping
itself is fairseq's (``DistributedFairseqModel``), on the CPU through the plugin's hook
(rag_plugin/fairseq_hooks/distributed.py: no ``device_ids`` for a CPU module). The driver checks after every
update that every trainable parameter holds a gradient (the last update too, which DDP would only notice at a
next one), and, with ``--store-ema``, that fairseq's EMA copy shares the model's knowledge source, still a
memory map, and that nothing closed a file descriptor twice.

One more test runs item 4's case on two real gloo ranks (torchrun + scripts/train_cpu_ddp.sh --ddp-backend
pytorch_ddp) and checks that both ranks end with the same parameters.

Marked ``slow``: about 40 s on 2 cores for the whole matrix (one process start, then ~1 s a case), 25 s for
the two-rank run.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow

DRIVER = '''\
"""Test-only: fairseq-train command lines run one after the other in a one-rank gloo torch DDP world."""
import json
import sys

import fairseq_cli.train  # first: fairseq's log format
import numpy as np
import torch.distributed as dist
from fairseq import checkpoint_utils, options
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.trainer import Trainer

cases, out_path, store = json.load(open(sys.argv[1])), sys.argv[2], sys.argv[3]
dist.init_process_group("gloo", init_method="file://" + store, rank=0, world_size=1)
Trainer.use_distributed_wrapper = property(lambda self: True)  # fairseq wraps only for a world larger than one
record = {}
unraisable = []
sys.unraisablehook = lambda info: unraisable.append(repr(info.exc_value))
_train_step = Trainer.train_step


def train_step(self, samples, raise_oom=False):
    result = _train_step(self, samples, raise_oom)
    missing = [n for n, p in self.model.named_parameters() if p.requires_grad and p.grad is None]
    record["steps"].append(missing[:5])
    return result


def save_checkpoint(cfg, trainer, epoch_itr, val_loss):
    wrapped = trainer.model.module  # fairseq's ModuleProxyWrapper around torch's DDP
    model = trainer.get_model()
    record.update(updates=trainer.get_num_updates(), wrapper=type(wrapped).__module__ + "." + type(wrapped).__name__,
                  find_unused_parameters=wrapped.find_unused_parameters, device_ids=wrapped.device_ids)
    if trainer.cfg.ema.store_ema:
        ema = trainer.ema.get_model()
        ks = model.context.knowledge
        record["ema"] = {"is_copy": ema is not model,
                         "weights_apart": all(a.data_ptr() != b.data_ptr()
                                              for a, b in zip(ema.parameters(), model.parameters())),
                         "shares_retriever": ema.retriever is model.retriever,
                         "shares_context": ema.context is model.context,
                         "vectors_memmap": isinstance(ks.vectors, np.memmap)}
    return _save(cfg, trainer, epoch_itr, val_loss)


Trainer.train_step = train_step
_save = checkpoint_utils.save_checkpoint
checkpoint_utils.save_checkpoint = save_checkpoint
for case in cases:
    record.clear()
    record.update(name=case["name"], steps=[])
    try:
        sys.argv = ["fairseq-train", *case["args"]]  # as fairseq-train sees it (its parser reads --user-dir first)
        parser = options.get_training_parser()
        args = options.parse_args_and_arch(parser)
        fairseq_cli.train.main(convert_namespace_to_omegaconf(args))
        record["ok"] = True
    except BaseException as e:  # recorded: the next case runs
        record.update(ok=False, error=f"{type(e).__name__}: {e}"[:2000])
    import gc

    gc.collect()
    record["unraisable"] = list(unraisable)
    unraisable.clear()
    with open(out_path, "a") as fh:
        fh.write(json.dumps(record) + "\\n")
'''

FID = ["--arch", "fid_tiny", "--criterion", "reader_cross_entropy"]
SEQ = ["--arch", "rag_seq_tiny"]
LM = ["--arch", "rag_lm_token_tiny", "--max-source-positions", "64", "--max-target-positions", "32"]


def _start(loss):
    return ["--retriever-loss", loss, "--retriever-loss-start", "2"]  # updates 0 and 1 without it, 2 with it


#: name -> the options that differ from a 3-update rag_token_tiny run with dense retrieval and K=3
CASES = {
    "rag_token": ["--validate-interval-updates", "2"],  # validation under the wrapper too
    "rag_seq": SEQ,
    "closed_book": ["--n-docs", "0"],
    "fid": FID,
    "bm25": ["--retriever", "bm25"],
    "fid_bm25": [*FID, "--retriever", "bm25"],
    "hybrid_rrf": ["--retriever", "hybrid"],
    "hybrid_weighted": ["--retriever", "hybrid", "--fusion", "weighted"],
    "frozen_query_encoder": ["--freeze-query-encoder"],
    "frozen_query_embeddings": ["--freeze-query-embeddings"],
    "lr_scale_1": ["--query-encoder-lr-scale", "1"],   # plain parameters (no reparametrisation)
    "lr_scale_0.1": ["--query-encoder-lr-scale", "0.1"],
    "pdist": ["--retriever-loss", "pdist"],
    "pdist_start": _start("pdist"),
    "emdr2": ["--retriever-loss", "emdr2"],
    "emdr2_start": _start("emdr2"),
    "loop": ["--retriever-loss", "loop"],
    "loop_start": _start("loop"),
    "rag_seq_loop_start": [*SEQ, *_start("loop")],
    "hybrid_pdist_start": ["--retriever", "hybrid", *_start("pdist")],
    "fid_adist": [*FID, "--retriever-loss", "adist"],
    "fid_adist_start": [*FID, *_start("adist")],            # issue 33 item 4: stopped at update 2
    "fid_hybrid_adist_start": [*FID, "--retriever", "hybrid", *_start("adist")],
    "doc_encoder": ["--train-doc-encoder"],
    "doc_encoder_shared_towers": ["--train-doc-encoder", "--share-encoder-towers"],
    "doc_encoder_rerank": ["--train-doc-encoder", "--rerank-top", "6"],
    "doc_encoder_top_layer": ["--train-doc-encoder", "--doc-encoder-train-layers", "1"],  # 2-layer source
    "doc_encoder_lr_scale_1": ["--train-doc-encoder", "--query-encoder-lr-scale", "1"],
    "doc_encoder_pdist_start": ["--train-doc-encoder", *_start("pdist")],
    "store_ema": ["--store-ema", "--ema-start-update", "1", "--save"],  # saves a checkpoint (with the EMA)
    "amp": ["--amp"],  # CPU autocast (rag_plugin/fairseq_hooks/mixed_precision.py)
    "bf16": ["--bf16"],
    "fid_adist_start_amp": [*FID, *_start("adist"), "--amp"],
    # the reranking stage (issue 35): the reranker's weights (maxsim's query BERT, the cross-encoder) or the generator
    # (upr) take the gradient; the first stage's query encoder is fixed
    "rerank_maxsim": ["--reranker", "maxsim", "--rerank-candidates", "6"],
    "rerank_upr": ["--reranker", "upr", "--rerank-candidates", "6"],
    "rerank_cross_pdist_start": ["--reranker", "cross", "--rerank-candidates", "6", *_start("pdist")],
    "bm25_rerank_maxsim": ["--retriever", "bm25", "--reranker", "maxsim", "--rerank-candidates", "6"],
    "hybrid_rerank_cross_amp": ["--retriever", "hybrid", "--reranker", "cross", "--rerank-candidates", "6", "--amp"],
    "fid_rerank_maxsim": [*FID, "--reranker", "maxsim", "--rerank-candidates", "6"],  # fixed: no signal reaches it
    "fid_scorebias_rerank_cross": [*FID, "--fid-score-bias", "--reranker", "cross", "--rerank-candidates", "6"],
    "rerank_maxsim_store_ema": ["--reranker", "maxsim", "--rerank-candidates", "6", "--store-ema",
                                "--ema-start-update", "1", "--save"],
    # decoder-only readers (issue 37): RAG over a fairseq transformer_lm
    "rag_lm_token": [*LM, "--validate-interval-updates", "2"],
    "rag_lm_seq": ["--arch", "rag_lm_seq_tiny", "--max-source-positions", "64", "--max-target-positions", "32"],
    "rag_lm_closed_book": [*LM, "--n-docs", "0"],
    "rag_lm_lsr": [*LM, "--freeze-generator", "--retriever-loss", "pdist", "--retriever-loss-only"],
    "rag_lm_hybrid_pdist_start": [*LM, "--retriever", "hybrid", *_start("pdist")],
    "rag_lm_amp": [*LM, "--amp"],
    "rag_lm_bf16": [*LM, "--bf16"],
    "rag_lm_store_ema": [*LM, "--store-ema", "--ema-start-update", "1", "--save"],
}


def _args(world, name, tmp_path, extra):
    ks = world["ks"]
    if "--doc-encoder-train-layers" in extra:
        from tests.tiny_world import layered_knowledge

        ks = layered_knowledge(world, 2)
    save = ["--save-dir", str(tmp_path / f"ckpt_{name}"), "--no-epoch-checkpoints"]
    if "--save" in extra:
        extra = [x for x in extra if x != "--save"]
    else:
        save.append("--no-save")
    if "--validate-interval-updates" not in extra and "--store-ema" not in extra:
        save.append("--disable-validation")
    return [str(world["data"]), "--user-dir", str(ROOT / "rag_plugin"), "--task", "retrieval_augmented",
            "--knowledge", str(ks), "--arch", "rag_token_tiny", "--criterion", "marginal_nll", "--n-docs", "3",
            "--optimizer", "adam", "--lr", "1e-3", "--batch-size", "4", "--max-update", "3", "--seed", "1",
            "--cpu", "--num-workers", "0", "--no-progress-bar", "--log-interval", "1", "--log-format", "simple",
            "--ddp-backend", "pytorch_ddp", *save, *extra]


@pytest.fixture(scope="module")
def runs(tiny_world, tmp_path_factory):
    """Every case, run once in one driver process: name -> what the driver recorded."""
    tmp = tmp_path_factory.mktemp("torch_ddp")
    driver = tmp / "driver.py"
    driver.write_text(DRIVER)
    cases = [{"name": name, "args": _args(tiny_world, name, tmp, extra)} for name, extra in CASES.items()]
    (tmp / "cases.json").write_text(json.dumps(cases))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    env.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)
    proc = subprocess.run([sys.executable, str(driver), str(tmp / "cases.json"), str(tmp / "out.jsonl"),
                           str(tmp / "store")], cwd=tmp, env=env, capture_output=True, text=True, timeout=600)
    out = tmp / "out.jsonl"
    records = [json.loads(line) for line in out.read_text().splitlines()] if out.is_file() else []
    assert proc.returncode == 0 and len(records) == len(cases), (proc.stdout + proc.stderr)[-4000:]
    return {r["name"]: r for r in records}


@pytest.mark.parametrize("name", list(CASES))
def test_torch_ddp_trains_three_updates_with_a_gradient_for_every_trainable_parameter(runs, name):
    r = runs[name]
    assert r["ok"], r.get("error")
    assert r["updates"] == 3
    assert r["wrapper"] == "torch.nn.parallel.distributed.DistributedDataParallel"
    assert r["find_unused_parameters"] is False and r["device_ids"] is None  # a CPU module: no device ids
    assert r["steps"] == [[], [], []], f"trainable parameters without a gradient, per update: {r['steps']}"
    assert r["unraisable"] == []


def test_store_ema_shares_the_memory_mapped_knowledge_source(runs):
    """fairseq's --store-ema keeps ``copy.deepcopy(model)``: it shares the retriever, the retrieval context and
    the knowledge source (vectors still a file-backed memory map), has its own weights, and no file descriptor
    is closed twice (the version lock's, copied, was: ``OSError: [Errno 9] Bad file descriptor`` at exit)."""
    r = runs["store_ema"]
    assert r["ok"], r.get("error")
    assert r["ema"] == {"is_copy": True, "weights_apart": True, "shares_retriever": True, "shares_context": True,
                        "vectors_memmap": True}
    assert r["unraisable"] == []


def test_two_rank_torch_ddp_fid_adist_with_a_start_keeps_the_ranks_identical(tiny_world, tmp_path):
    """The case of issue 33 item 4 on two gloo ranks (torchrun + scripts/train_cpu_ddp.sh --ddp-backend
    pytorch_ddp): FiD + adist + --retriever-loss-start 2 trains past update 2 with torch's DDP averaging the
    gradients, and both ranks end with the same parameters (test_distributed.py's driver records them)."""
    import stat

    from tests.fairseq_hooks.test_distributed import DRIVER as RECORDING_DRIVER

    driver = tmp_path / "ddp_driver.py"
    driver.write_text(RECORDING_DRIVER.format(python=sys.executable))
    driver.chmod(driver.stat().st_mode | stat.S_IXUSR)
    out = tmp_path / "out"
    out.mkdir()
    env = dict(os.environ, RAG_DDP_TEST_OUT=str(out), FAIRSEQ_TRAIN=str(driver), OMP_NUM_THREADS="1",
               PYTHONPATH=str(ROOT))
    env.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "--no-python",
           str(ROOT / "scripts" / "train_cpu_ddp.sh"), str(tiny_world["data"]), "--user-dir", str(ROOT / "rag_plugin"),
           "--task", "retrieval_augmented", "--knowledge", str(tiny_world["ks"]), "--arch", "fid_tiny",
           "--criterion", "reader_cross_entropy", "--n-docs", "3", "--retriever-loss", "adist",
           "--retriever-loss-start", "2", "--optimizer", "adam", "--lr", "1e-3", "--batch-size", "4",
           "--max-update", "4", "--seed", "1", "--save-dir", str(tmp_path / "ckpt"), "--no-epoch-checkpoints",
           "--num-workers", "0", "--no-progress-bar", "--log-interval", "1", "--log-format", "simple",
           "--disable-validation", "--ddp-backend", "pytorch_ddp"]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    assert "'ddp_backend': 'pytorch_ddp'" in log and "'ddp_backend': 'legacy_ddp'" not in log
    records = [[json.loads(line) for line in (out / f"rank{r}.jsonl").read_text().splitlines()] for r in (0, 1)]
    assert records[0][-1]["num_updates"] == records[1][-1]["num_updates"] == 4
    assert records[0][-1]["world_size"] == 2 and records[0][-1]["hash"] == records[1][-1]["hash"]
