"""examples/demo/run_demo.py in parts (its commands run by :mod:`rag_plugin.pipeline.commands`):
the recipe turned into command lines (:mod:`demo_run.recipe`), the step runner
(:mod:`demo_run.runner`), the steps (:mod:`demo_run.steps`) and RESULTS.md / RESULTS.json
(:mod:`demo_run.results`). Beside the demo's scripts, outside the installable package."""
