"""The training engine: DefaultTrainer and its loop."""
