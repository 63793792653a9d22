"""Gold passages of KILT records as passage-store rows (for the criterion's ``gold_doc_prob``)."""
import logging
from typing import Dict, List, Optional

import numpy as np

logger = logging.getLogger(__name__)


def rows_by_passage_id(store) -> Dict[str, List[int]]:
    """Passage id -> store rows; an id ``<doc>_<n>`` (a split document) also counts under ``<doc>``."""
    by_id: Dict[str, List[int]] = {}
    for row in range(len(store)):
        pid = store.id(row)
        by_id.setdefault(pid, []).append(row)
        base = pid.rsplit("_", 1)
        if len(base) == 2 and base[1].isdigit():
            by_id.setdefault(base[0], []).append(row)
    return by_id


def gold_rows(provenance: List[List[str]], by_id: Dict[str, List[int]]) -> Optional[np.ndarray]:
    """Store rows of the gold passages ([N, G], -1 padded), or None if the data names none that is in
    the knowledge source. A provenance id matches a passage id, or every ``<id>_<n>`` passage split from it."""
    if not any(provenance):
        return None
    rows = [sorted({r for pid in prov for r in by_id.get(pid, [])}) for prov in provenance]
    named = sum(1 for prov in provenance if prov)
    lost = sum(1 for prov, r in zip(provenance, rows) if prov and not r)
    if lost:
        example = next(prov[0] for prov, r in zip(provenance, rows) if prov and not r)
        logger.warning("%d of %d records name gold passages none of which is in the knowledge source (e.g. "
                       "%r): gold_doc_prob leaves them out", lost, named, example)
    if lost == named:
        return None  # no gold passage here at all: as if the data named none
    width = max(1, max(len(r) for r in rows))
    out = np.full((len(rows), width), -1, dtype=np.int64)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out
