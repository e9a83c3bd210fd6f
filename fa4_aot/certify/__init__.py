"""Certification: every kernel run on a GPU of its SKU and checked before clients run it."""
