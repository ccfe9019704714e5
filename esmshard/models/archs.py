"""The published shapes of each family, by their makers' names (`random:<name>` builds one)."""

from .spec import Arch

ESM2 = {
    "esm2_t6_8M_UR50D": Arch(6, 320, 20),
    "esm2_t12_35M_UR50D": Arch(12, 480, 20),
    "esm2_t30_150M_UR50D": Arch(30, 640, 20),
    "esm2_t33_650M_UR50D": Arch(33, 1280, 20),
    "esm2_t36_3B_UR50D": Arch(36, 2560, 40),
    "esm2_t48_15B_UR50D": Arch(48, 5120, 40),
}
# ESM-1b, and ESM-1v's five (the variant-effect ensemble: one shape, five seeds)
ESM1 = {
    "esm1b_t33_650M_UR50S": Arch(33, 1280, 20),
    **{f"esm1v_t33_650M_UR90S_{k}": Arch(33, 1280, 20) for k in range(1, 6)},
}
ESMC = {
    "esmc_300m": Arch(30, 960, 15),
    "esmc_600m": Arch(36, 1152, 18),
    "esmc_6b": Arch(80, 2560, 40),
}


def heads_of(archs: dict, layers: int, dim: int) -> int | None:
    """The heads of the published shape of `layers` and `dim`, None if none has them."""
    return next((a.heads for a in archs.values() if (a.layers, a.dim) == (layers, dim)), None)
