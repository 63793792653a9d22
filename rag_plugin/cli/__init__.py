"""Every command line of the plugin: one module per console script (see setup.py), each a parser
and a ``main(argv=None) -> int``. ``scripts/`` holds thin entry points over these modules."""
