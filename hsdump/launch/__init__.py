"""Launchers beyond Hydra's: Ray."""
