"""Cameras: the value the pipeline renders from, camera models, lens maths and camera paths (the ground floor)."""
