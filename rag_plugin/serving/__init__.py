"""rag-serve: an HTTP service over a trained checkpoint (answers with their passages and per-token posterior,
retrieval alone for other processes, a web page), with dynamic batching.

Layers, each its own file: :mod:`.settings` (the service's limits and options), :mod:`.schemas` (the request and
response bodies, validated), :mod:`.explain` (the passages' posteriors of an answer), :mod:`.engine` (the model:
a batch of questions in, answers out; one compute thread), :mod:`.search` (retrieval only), :mod:`.batcher`
(gathers concurrent requests into batches), :mod:`.app` (the ASGI routes and errors), :mod:`.server` (one
process: uvicorn, graceful SIGTERM), :mod:`.workers` (several, sharing the knowledge source's mapping) and
:mod:`.launch` (which of the two). Importing this package imports no web framework; ``rag-serve``
(:mod:`rag_plugin.cli.serve`) does.
"""
