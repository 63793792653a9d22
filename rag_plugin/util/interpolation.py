"""Options a plugin config takes from fairseq's by interpolation (``II("common_eval.quiet")``, ...), read safely."""


def interpolated(cfg, name: str, default=None):
    """``cfg.name``, or ``default`` where there is nothing to take: the interpolation's target is not in this config
    (a config built without fairseq's around it, a criterion other than the one named), or the dataclass's own
    unresolved ``"${...}"`` default."""
    try:
        value = getattr(cfg, name, default)
    except Exception:  # omegaconf: the interpolation's target is not in this config
        return default
    return default if isinstance(value, str) and value.startswith("${") else value
