"""``gsrecon merge``'s options (gsrecon/cli.py only dispatches to :func:`~gsrecon.partition.runner.merge_run`)."""

from __future__ import annotations

import argparse

SUMMARY = "merge the trained blocks of a block-training run into one scene"
DESCRIPTION = (
    "Merge the blocks of a run trained with partition.blocks and partition.only (one block per call, e.g. the "
    "tasks of a Slurm job array) into one scene in the run folder: each block's Gaussians inside its own cell, "
    "fine-tuned for partition.merge_steps steps when the config asks, scored on every test view. Refuses a run "
    "whose blocks have not all finished, naming them."
)


def add_merge_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--exp-dir", required=True, help="the block-training run folder (holds partition.json)")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N | mps")
    p.add_argument("overrides", nargs="*", help="key=value changes of the run's config.yaml: partition.merge_steps=500")
