"""The training engine: DefaultTrainer and its loop, the hook contract, building and checking a run, run folders,
checkpoints, evaluation and inference."""
