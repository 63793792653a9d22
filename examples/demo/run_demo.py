#!/usr/bin/env python
"""The main job on the embedded default: real offline data -> knowledge source -> training ->
generation -> evaluation -> leaderboard, plus the index hot-swap test, the per-token document
posterior plot and the K sweep (the paper's Figure 3).

    python examples/demo/run_demo.py [--systems NAME,...|all] [--work runs/demo] [--updates N] ...

Every step runs the command a user would type (printed as it runs: rag-build-knowledge,
fairseq-train, ...), writes under --work (data under data/demo) and is skipped when its output is
already complete, so a rerun after an interruption continues where it stopped. The training
recipe is rag_plugin/pipeline/config/recipe/tiny.yaml, shipped in the package (what
fairseq-hydra-train runs with examples/demo/config/*.yaml); examples/demo/stages.yaml says which
config and options each run uses; this script adds only each run's data, paths and number of
updates. --systems chooses the systems trained and tested (the default, stages.yaml's default_systems,
keeps the run within ~100 min on 2 cores; all: every one). At the end: RESULTS.md and RESULTS.json in
the repository root, this run's rows merged into the earlier runs' (each row names its run), and PNG
plots under --work.
"""
import sys
import time

from demo_run.runner import ROOT, Runner  # examples/demo/demo_run, beside this script

from rag_plugin.cli.common import ArgumentParser
from rag_plugin.util.errors import cli_main


def parse_args(argv=None):
    from demo_run.recipe import load_stages
    from demo_run.selection import default_systems, systems_help

    stages = load_stages()
    ap = ArgumentParser(description=__doc__)
    ap.add_argument("--systems", default=",".join(default_systems(stages)), help=systems_help(stages))
    ap.add_argument("--work", default="runs/demo", help="where checkpoints, outputs and plots go")
    ap.add_argument("--pretrain-updates", type=int, default=1500, help="denoising pretraining updates")
    ap.add_argument("--pseudo-updates", type=int, default=2000,
                    help="updates of the second pretraining stage (pseudo-questions, BM25, one document); 0: none")
    ap.add_argument("--updates", type=int, default=400, help="training updates per system")
    ap.add_argument("--hotswap-updates", type=int, default=400,
                    help="updates on the country facts both sources state alike, before the hot-swap test "
                         "(0: test the nq_demo models as they are)")
    ap.add_argument("--jeopardy-updates", type=int, default=150, help="updates of the Jeopardy RAG-Token model")
    ap.add_argument("--sweep", default="1,3,5,8,16", help="test-time K values of the sweep")
    return ap.parse_args(argv)


@cli_main
def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    from demo_run.history import file_sha256
    from demo_run.recipe import load_stages
    from demo_run.results import command_line, run_labels, systems_table, write_results
    from demo_run.selection import Selection
    from demo_run.steps import Demo

    stages = load_stages()
    selection = Selection.of(args.systems, stages)
    work = (ROOT / args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    runner = Runner(log=lambda m: print(m, flush=True))
    runner.log("systems: " + ", ".join(selection.systems))
    demo = Demo(runner, work, stages)
    demo.data_and_knowledge()
    pretrained = demo.pretrain(args.pretrain_updates, args.pseudo_updates)
    trained = selection.trained(stages)
    lm_init = None
    if any(stage.get("init") for stage in trained.values()):  # a decoder-only reader runs (issue 37)
        from demo_run.decoder_only import pretrain_lm

        lm_init = pretrain_lm(demo, args.pretrain_updates, args.pseudo_updates)
    checkpoints = demo.train_systems(args.updates, init=pretrained, systems=trained, lm_init=lm_init)
    demo.leaderboard(checkpoints)
    demo.k_sweep(checkpoints, [int(k) for k in args.sweep.split(",")])
    if selection.hot_swap(stages):
        demo.hot_swap(checkpoints, args.hotswap_updates)
    else:
        runner.log("\n== index hot-swap test: not run (it compares " + ", ".join(stages.generate.hot_swap.systems)
                   + "; --systems names them all to run it)")
    if selection.jeopardy():
        demo.posterior_plot(pretrained, args.jeopardy_updates)
    record = {"command": command_line(argv), "systems": list(selection.systems),
              "settings": {k: v for k, v in vars(args).items() if k != "systems"},
              "pretrained_sha256": file_sha256(pretrained), "reused": demo.reused}
    merged = write_results(demo.results, record, runner.timings, time.perf_counter() - started, work, stages)
    runner.log(f"\nRESULTS.md and RESULTS.json written ({(time.perf_counter() - started) / 60:.1f} min in all)")
    print("\n" + "\n".join(systems_table(merged, run_labels(merged))))
    if "rag_token" in checkpoints:
        print("\n" + serve_command(checkpoints["rag_token"]), flush=True)
    return 0


def serve_command(checkpoint) -> str:
    """The one command that serves the demo's RAG-Token model (rag-serve: docs/serving.md), paths as typed from the
    repository root."""
    from demo_run.runner import KS

    def shown(path) -> str:
        try:
            return str(path.resolve().relative_to(ROOT.resolve()))
        except ValueError:
            return str(path)

    return ("Serve the RAG-Token model (answers, passages and per-token posterior at http://127.0.0.1:8000/):\n"
            f"  .venv/bin/rag-serve --path {shown(checkpoint)} --knowledge {shown(KS)} --port 8000")


if __name__ == "__main__":
    sys.exit(main())
