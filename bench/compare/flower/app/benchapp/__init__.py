"""Flower peer job for atoll's side-by-side benchmark."""
