"""Every command line of the plugin: one module per console script (setup.py's CONSOLE_SCRIPTS, the one
table of them), each a parser and a ``main(argv=None) -> int``."""
