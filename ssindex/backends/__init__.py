"""Embedding backends and the per-phase selector: the only place a runtime is chosen."""
