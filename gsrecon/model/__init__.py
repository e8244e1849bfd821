"""Gaussian model, densification strategies and optimisation."""
