"""Writers (TensorBoard, JSONL) and the rich console logger."""
