"""Block training: a capture split into spatial blocks over its ground plane, each trained as a run of its own
(one after another, shared by torchrun ranks, or as a cluster's job array), and merged into one scene: the runner
and the merge (the plan itself is data-level: :mod:`gsrecon.data.blocks`)."""
