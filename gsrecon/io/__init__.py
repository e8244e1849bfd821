"""Gaussian-agnostic file formats shared by model/, data/ and export/."""
