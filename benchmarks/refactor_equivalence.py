#!/usr/bin/env python
"""Does a refactor change any number? The same short ``fairseq-train`` runs, then ``fairseq-generate`` from their
checkpoints, with two source trees of rag_plugin (an old commit's worktree and the current checkout), compared.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/refactor_equivalence.py --old /tmp/rag_old --new /work/main \\
        [--json-out FILE] [--updates 15] [--only NAME ...] [--workdir DIR]

The tiny world of tests/tiny_world.py (its ``make_world`` imported from the NEW tree) is built once. For each
configuration of ``CONFIGS`` both trees run the .venv's ``fairseq-train`` with ``--user-dir <tree>/rag_plugin``
and ``PYTHONPATH=<tree>`` (ahead of the checkout's editable install, whose finder comes after sys.path),
OMP_NUM_THREADS=1, ``--seed 1``, ``--log-format json --log-interval 1``. Compared: every logged statistic of
every ``train_inner``, ``train`` and ``valid`` record but the clocks (wps, ups, wall), as the same string; the
final model's parameters (the ``model`` of checkpoint_last.pt), bit for bit; the H- lines (and the S/T/D/P/Z
lines) of ``fairseq-generate`` (beam 2, the 5 test questions) from each checkpoint. fairseq logs losses rounded
to 3 decimals: the parameters after the last update are the exact check.

Which code ran is checked, not assumed: a ``sitecustomize`` on each run's PYTHONPATH writes, at exit, the files of
every ``rag_plugin`` module the process imported (a namespace package's folders); each must lie in that run's tree.
Exit status 0 when every configuration is identical, 1 otherwise.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

BIN = Path(sys.executable).parent
CLOCKS = ("wps", "ups", "wall", "gb_free")
GEN_PREFIXES = ("S-", "T-", "H-", "D-", "P-", "Z-")
PROBE = '''import atexit, json, os, sys
def _write():
    mods = [m for n, m in list(sys.modules.items()) if n == "rag_plugin" or n.startswith("rag_plugin.")]
    files = sorted({f for m in mods for f in ([m.__file__] if getattr(m, "__file__", None)
                                              else list(getattr(m, "__path__", [])) or ["?" + m.__name__])})
    with open(os.environ["EQUIVALENCE_PROBE_OUT"], "w") as f:
        json.dump(files, f)
atexit.register(_write)
'''


@dataclass(frozen=True)
class Config:
    """One comparison: what fairseq-train is given besides the common options (``task`` options go to
    fairseq-generate too), the ``--rag-decoding`` values generated with (``()``: fairseq-generate's default), and
    whether generation needs the knowledge source re-embedded with the checkpoint's document tower first (each tree
    its own copy, by its own ``rag-update-knowledge --reembed``: the plugin refuses to retrieve otherwise)."""
    name: str
    arch: str
    criterion: str = "marginal_nll"
    n_docs: int = 3
    task: tuple = ()
    train: tuple = ()
    decodings: tuple = ()
    reembed: bool = False


CONFIGS = (
    Config("rag_token", "rag_token_tiny"),
    Config("rag_seq", "rag_seq_tiny", decodings=("thorough", "fast")),
    Config("rag_token bm25", "rag_token_tiny", task=("--retriever", "bm25")),
    Config("rag_token hybrid", "rag_token_tiny", task=("--retriever", "hybrid")),
    Config("rag_token pdist", "rag_token_tiny", train=("--retriever-loss", "pdist")),
    Config("fid reader_ce", "fid_tiny", criterion="reader_cross_entropy"),
    Config("fid reader_ce adist", "fid_tiny", criterion="reader_cross_entropy", train=("--retriever-loss", "adist")),
    Config("rag_token doc-encoder rerank6", "rag_token_tiny", train=("--train-doc-encoder", "--rerank-top", "6"),
           reembed=True),
    Config("closed book", "rag_token_tiny", n_docs=0),
)


# ------------------------------------------------------------------------------------ running the trees
def tree_env(tree: Path, probe_dir: Path, probe_out: Path) -> dict:
    env = dict(os.environ)
    env.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONPATH=f"{probe_dir}{os.pathsep}{tree}",
               EQUIVALENCE_PROBE_OUT=str(probe_out), PYTHONHASHSEED="0")
    return env


def common(world: dict, tree: Path, cfg: Config, knowledge: Path | None = None) -> list:
    return [str(world["data"]), "--user-dir", str(tree / "rag_plugin"), "--task", "retrieval_augmented",
            "--knowledge", str(knowledge or world["ks"]), "--n-docs", str(cfg.n_docs), "--cpu", "--num-workers", "0",
            "--seed", "1", *cfg.task]


def train_cmd(world: dict, tree: Path, cfg: Config, save: Path, updates: int) -> list:
    return [str(BIN / "fairseq-train"), *common(world, tree, cfg), "--arch", cfg.arch, "--criterion", cfg.criterion,
            "--optimizer", "adam", "--lr", "1e-3", "--batch-size", "8", "--max-update", str(updates),
            "--save-dir", str(save), "--no-epoch-checkpoints", "--no-progress-bar", "--log-format", "json",
            "--log-interval", "1", *cfg.train]


def generate_cmd(world: dict, tree: Path, cfg: Config, ckpt: Path, decoding: str | None, knowledge: Path) -> list:
    extra = ["--rag-decoding", decoding] if decoding else []
    return [str(BIN / "fairseq-generate"), *common(world, tree, cfg, knowledge), "--path", str(ckpt),
            "--gen-subset", "test", "--beam", "2", "--max-len-b", "8", "--batch-size", "2", *extra]


def run_both(cmds: dict, work: Path, probe_dir: Path, tag: str, timeout: int = 1800) -> dict:
    """Each tree's command at once (one thread each); {side: (returncode, stdout, stderr, rag_plugin files)}."""
    procs = {}
    for side, (tree, cmd) in cmds.items():
        cwd = work / side
        cwd.mkdir(parents=True, exist_ok=True)
        probe = cwd / f"probe_{tag}.json"
        probe.unlink(missing_ok=True)
        procs[side] = (probe, subprocess.Popen(cmd, cwd=cwd, env=tree_env(tree, probe_dir, probe), text=True,
                                               stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    out = {}
    for side, (probe, proc) in procs.items():
        stdout, stderr = proc.communicate(timeout=timeout)
        files = json.loads(probe.read_text()) if probe.is_file() else []
        (work / side / f"{tag}.log").write_text(stdout + stderr)
        out[side] = (proc.returncode, stdout, stderr, files)
    return out


def foreign_modules(files: list, tree: Path) -> list:
    """The imported rag_plugin files that are not in ``tree/rag_plugin`` (all of them when none was recorded)."""
    if not files:
        return ["<no rag_plugin module recorded>"]
    root = str((tree / "rag_plugin").resolve()) + os.sep
    return [f for f in files if not str(Path(f).resolve()).startswith(root)]


def check_import(tree: Path, probe_dir: Path) -> str:
    """``rag_plugin.__file__`` under the environment a run of ``tree`` gets (a plain ``python -c``)."""
    env = tree_env(tree, probe_dir, probe_dir / "unused.json")
    proc = subprocess.run([sys.executable, "-c", "import rag_plugin; print(rag_plugin.__file__)"], env=env,
                          capture_output=True, text=True, cwd=probe_dir, timeout=120)
    if proc.returncode != 0 or not proc.stdout.strip().startswith(str(tree / "rag_plugin")):
        sys.exit(f"error: PYTHONPATH={tree} does not import {tree}/rag_plugin: "
                 f"{proc.stdout.strip()}{proc.stderr[-500:]}")
    return proc.stdout.strip()


# ------------------------------------------------------------------------------------ comparing
def records(log: str) -> dict:
    """fairseq's json log records by kind (train_inner, train, valid): lists of dicts, in order."""
    found = {}
    for line in log.splitlines():
        for kind in ("train_inner", "train", "valid"):
            marker = f" | {kind} | "
            if marker in line and line.rstrip().endswith("}"):
                found.setdefault(kind, []).append(json.loads(line[line.index(marker) + len(marker):]))
    return found


def _is_clock(key: str) -> bool:
    return key.rsplit("_", 1)[-1] in CLOCKS or key.endswith("_wall")


def _loss_key(key: str) -> bool:
    return key in ("loss", "valid_loss", "train_loss")


def compare_logs(old: dict, new: dict) -> dict:
    """Every record's statistics but the clocks, exactly; the largest |loss difference|; the first difference."""
    result = {"updates": 0, "max_loss_diff": 0.0, "first_difference": None, "only_old": set(), "only_new": set()}
    for kind in ("train_inner", "train", "valid"):
        a, b = old.get(kind, []), new.get(kind, [])
        if len(a) != len(b) and result["first_difference"] is None:
            result["first_difference"] = {"kind": kind, "records_old": len(a), "records_new": len(b)}
        for i, (ra, rb) in enumerate(zip(a, b)):
            result["only_old"] |= set(ra) - set(rb)
            result["only_new"] |= set(rb) - set(ra)
            for key in sorted(set(ra) & set(rb)):
                if _is_clock(key):
                    continue
                if _loss_key(key):
                    result["max_loss_diff"] = max(result["max_loss_diff"], abs(float(ra[key]) - float(rb[key])))
                if ra[key] != rb[key] and result["first_difference"] is None:
                    result["first_difference"] = {"kind": kind, "record": i, "num_updates": ra.get("num_updates"),
                                                  "key": key, "old": ra[key], "new": rb[key]}
        if kind == "train_inner":
            result["updates"] = min(len(a), len(b))
    result["only_old"], result["only_new"] = sorted(result["only_old"]), sorted(result["only_new"])
    return result


def _same(a, b) -> bool:
    """Equal, tensors bit for bit (a model's state also holds plain values: extra state)."""
    import torch

    if torch.is_tensor(a) or torch.is_tensor(b):
        return torch.is_tensor(a) and torch.is_tensor(b) and a.shape == b.shape and a.dtype == b.dtype \
            and torch.equal(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def compare_parameters(old_ckpt: Path, new_ckpt: Path) -> dict:
    """The checkpoints' ``model`` entries: same names, bit-identical values (else the largest |difference|)."""
    import torch

    a = torch.load(old_ckpt, map_location="cpu", weights_only=False)["model"]
    b = torch.load(new_ckpt, map_location="cpu", weights_only=False)["model"]
    differing, max_diff = [], 0.0
    for key in sorted(set(a) & set(b)):
        if not _same(a[key], b[key]):
            differing.append(key)
            if torch.is_tensor(a[key]) and torch.is_tensor(b[key]) and a[key].shape == b[key].shape \
                    and a[key].is_floating_point():
                max_diff = max(max_diff, float((a[key].double() - b[key].double()).abs().max()))
    return {"entries": len(set(a) | set(b)), "tensors": sum(map(torch.is_tensor, a.values())),
            "only_old": sorted(set(a) - set(b)), "only_new": sorted(set(b) - set(a)),
            "differing": differing, "max_abs_diff": max_diff, "identical": not differing and set(a) == set(b)}


def generated_lines(stdout: str) -> dict:
    return {p: [line for line in stdout.splitlines() if line.startswith(p)] for p in GEN_PREFIXES}


def compare_generation(old_out: str, new_out: str) -> dict:
    a, b = generated_lines(old_out), generated_lines(new_out)
    first = next(((x, y) for x, y in zip(a["H-"], b["H-"]) if x != y), None)
    return {"hypotheses": len(a["H-"]), "h_identical": bool(a["H-"]) and a["H-"] == b["H-"],
            "other_identical": all(a[p] == b[p] for p in GEN_PREFIXES if p != "H-"),
            "first_differing_h": first}


# ------------------------------------------------------------------------------------ one configuration
def _failed(row: dict, step: str, runs: dict) -> bool:
    """Records each side's failure of ``step``; whether there was one."""
    for side, (rc, stdout, stderr, _) in runs.items():
        if rc != 0:
            row["errors"][side] = f"{step} exit {rc}: " + (stdout + stderr)[-1500:]
    return bool(row["errors"])


def _check_probes(row: dict, runs: dict, trees: dict, step: str) -> None:
    for side, (rc, _, _, files) in runs.items():
        foreign = foreign_modules(files, trees[side])
        row["modules"][f"{side} {step}"] = len(files)
        if foreign and rc == 0:
            row["errors"][side] = f"{step} imported rag_plugin modules from outside {trees[side]}: {foreign[:5]}"


def _knowledge(cfg: Config, world: dict, trees: dict, base: Path, ckpts: dict, probe_dir: Path, row: dict) -> dict:
    """The knowledge source each side generates with: the world's, or a copy re-embedded by that tree."""
    if not cfg.reembed:
        return {side: world["ks"] for side in trees}
    copies = {side: base / side / "ks" for side in trees}
    for copy in copies.values():
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(world["ks"], copy)
    runs = run_both({side: (tree, [str(BIN / "rag-update-knowledge"), "--knowledge", str(copies[side]),
                                   "--reembed", str(ckpts[side])]) for side, tree in trees.items()},
                    base, probe_dir, "reembed")
    _check_probes(row, runs, trees, "reembed")
    _failed(row, "rag-update-knowledge --reembed", runs)
    return copies


def run_config(cfg: Config, world: dict, trees: dict, work: Path, probe_dir: Path, updates: int) -> dict:
    """Train on both trees, compare logs and parameters, generate from both checkpoints and compare."""
    row = {"config": cfg.name, "errors": {}, "modules": {}, "generation": {}}
    base = work / cfg.name.replace(" ", "_")
    runs = run_both({side: (tree, train_cmd(world, tree, cfg, base / side / "ckpt", updates))
                     for side, tree in trees.items()}, base, probe_dir, "train")
    _check_probes(row, runs, trees, "train")
    if _failed(row, "fairseq-train", runs):
        return row
    row["logs"] = compare_logs(records(runs["old"][1] + runs["old"][2]), records(runs["new"][1] + runs["new"][2]))
    ckpts = {side: base / side / "ckpt" / "checkpoint_last.pt" for side in trees}
    row["parameters"] = compare_parameters(ckpts["old"], ckpts["new"])
    knowledge = _knowledge(cfg, world, trees, base, ckpts, probe_dir, row)
    for decoding in cfg.decodings or (None,):
        if row["errors"]:
            break
        tag = f"generate_{decoding or 'default'}"
        gen = run_both({side: (tree, generate_cmd(world, tree, cfg, ckpts[side], decoding, knowledge[side]))
                        for side, tree in trees.items()}, base, probe_dir, tag)
        _check_probes(row, gen, trees, tag)
        if not _failed(row, f"fairseq-generate {tag}", gen):
            row["generation"][decoding or "default"] = compare_generation(gen["old"][1], gen["new"][1])
    return row


def verdict(row: dict) -> dict:
    """The table's columns of one row ("-": not reached, a step before failed)."""
    logs, params, gens = row.get("logs"), row.get("parameters"), row["generation"].values()
    out = {"updates": "-", "loss": "-", "stats": "-", "params": "-", "hyps": "ERROR" if row["errors"] else "-"}
    if logs:
        out.update(updates=str(logs["updates"]), loss=f"{logs['max_loss_diff']:.3g}",
                   stats="yes" if logs["first_difference"] is None else "NO")
    if params:
        out["params"] = "yes" if params["identical"] else "NO"
    if gens and not row["errors"]:
        out["hyps"] = "yes" if all(g["h_identical"] and g["other_identical"] for g in gens) else "NO"
    return out


def identical(row: dict) -> bool:
    return all(v in ("yes",) for k, v in verdict(row).items() if k in ("stats", "params", "hyps"))


def print_table(rows: list) -> None:
    head = ("config", "updates compared", "max |loss diff|", "logged stats identical", "parameters bit-identical",
            "hypotheses identical")
    cells = [head] + [(r["config"], *verdict(r).values()) for r in rows]
    widths = [max(len(str(c[i])) for c in cells) for i in range(len(head))]
    for i, line in enumerate(cells):
        print(" | ".join(str(c).ljust(w) for c, w in zip(line, widths)))
        if i == 0:
            print("-+-".join("-" * w for w in widths))


# ------------------------------------------------------------------------------------ main
def build_world(new: Path, root: Path) -> dict:
    """tests/tiny_world.py's world, from the NEW tree (its make_world and its rag_plugin)."""
    sys.path.insert(0, str(new))
    from tests.tiny_world import make_world

    world = make_world(root)
    return {"data": world["data"], "ks": world["ks"]}


def tree_state(tree: Path) -> dict:
    """The commit a tree is at and whether its rag_plugin/ has changes not committed (read-only git)."""
    def git(*args):
        return subprocess.run(["git", "-C", str(tree), *args], capture_output=True, text=True).stdout

    return {"path": str(tree), "commit": git("rev-parse", "HEAD").strip(),
            "uncommitted_in_rag_plugin": git("status", "--short", "--", "rag_plugin").splitlines()}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--old", type=Path, required=True, help="the source tree before the refactor")
    p.add_argument("--new", type=Path, required=True, help="the source tree after it (its tests/tiny_world.py is used)")
    p.add_argument("--json-out", type=Path, help="write the rows and the trees' commits here as JSON")
    p.add_argument("--updates", type=int, default=15, help="fairseq-train --max-update of every run")
    p.add_argument("--only", nargs="*", help="run only the configurations of these names")
    p.add_argument("--workdir", type=Path, help="the world, checkpoints and logs, kept (default: a new temp dir)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    trees = {"old": args.old.resolve(), "new": args.new.resolve()}
    configs = [c for c in CONFIGS if not args.only or c.name in args.only]
    work = args.workdir or Path(tempfile.mkdtemp(prefix="refactor_equivalence_"))
    probe_dir = work / "probe"
    probe_dir.mkdir(parents=True, exist_ok=True)
    (probe_dir / "sitecustomize.py").write_text(PROBE)
    t0 = time.time()
    imported = {side: check_import(tree, probe_dir) for side, tree in trees.items()}
    print(f"rag_plugin imported from: old {imported['old']}, new {imported['new']}", flush=True)
    world = build_world(trees["new"], work / "world")
    print(f"tiny world built in {time.time() - t0:.0f} s under {work}", flush=True)
    rows = []
    for i, cfg in enumerate(configs, 1):
        started = time.time()
        row = run_config(cfg, world, trees, work, probe_dir, args.updates)
        row["seconds"] = round(time.time() - started, 1)
        rows.append(row)
        state = "identical" if identical(row) else ("ERROR" if row["errors"] else "DIFFERS")
        print(f"[{i}/{len(configs)}] {cfg.name}: {state} ({row['seconds']} s)", flush=True)
        for side, err in row["errors"].items():
            print(f"    {side}: {err}", flush=True)
    print()
    print_table(rows)
    seconds = round(time.time() - t0)
    print(f"\n{sum(map(identical, rows))}/{len(rows)} configurations identical; {seconds} s; logs under {work}")
    if args.json_out:
        report = {"command": [sys.executable, *sys.argv], "seconds": seconds, "workdir": str(work),
                  "updates": args.updates, "trees": {side: tree_state(tree) for side, tree in trees.items()},
                  "rows": rows}
        args.json_out.write_text(json.dumps(report, indent=1, default=str) + "\n")
    return 0 if all(map(identical, rows)) else 1


if __name__ == "__main__":
    sys.exit(main())
