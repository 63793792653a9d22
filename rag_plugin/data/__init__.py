"""Runtime data: the one KILT reader, the fairseq dataset, gold passages as store rows."""
