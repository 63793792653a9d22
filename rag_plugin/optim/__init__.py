"""fairseq optimizers of the plugin (registered when rag_plugin is loaded as a user dir)."""
