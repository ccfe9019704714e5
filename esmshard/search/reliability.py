"""How far a neighbour's annotation can be trusted: the reliability index (RI) that goPredSim
(Littmann et al. 2021) defined for annotation transfer by embedding distance and EAT (Heinzinger
et al. 2022) reports beside each transfer.

For the euclidean distance d, RI = 0.5 / (0.5 + d): 1 for the same embedding, 0.5 at d = 0.5,
falling towards 0 as the neighbour moves away. For the cosine distance (1 - cosine similarity),
RI is the similarity itself, 1 - d.
"""

import numpy as np


def reliability_index(distances, metric: str = "euclidean") -> np.ndarray:
    """The RI of each distance (inf, no neighbour: 0)."""
    d = np.asarray(distances, dtype=np.float64)
    ri = 0.5 / (0.5 + d) if metric == "euclidean" else 1.0 - d
    return np.where(np.isfinite(d), ri, 0.0)
