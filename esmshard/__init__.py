"""esmshard: sharded, multi-GPU ESM-2 protein embeddings."""

import logging
import signal
import sys

__version__ = "0.1.0"


def run_step(log_path, step, **kwargs):
    """Run one workflow step with its log file; input problems end it with their message alone."""
    from .fasta import FastaError
    from .merge import MergeError
    from .model import ModelError

    console = logging.StreamHandler(sys.stderr)
    console.setLevel(
        logging.WARNING
    )  # the job log gets everything; the run's output only problems
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        handlers=[logging.FileHandler(log_path, mode="w"), console],
    )
    # Cluster walltime and `kill` send SIGTERM: unwind like Ctrl-C, so temporary files are
    # removed and the GPU slot's lock is released on the way out.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        return step(**kwargs)
    except (FastaError, ModelError, MergeError, ValueError) as err:
        logging.getLogger("esmshard").error("%s", err)
        sys.exit(1)
