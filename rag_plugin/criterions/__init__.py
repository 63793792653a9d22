"""The criterion (marginal NLL) and the retrieval-health monitor it reports to."""
