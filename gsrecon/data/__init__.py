"""Datasets: cameras, readers (COLMAP, Blender, synthetic) and the training datapipeline."""
