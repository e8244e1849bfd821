"""gsrecon: 3D Gaussian Splatting training."""
