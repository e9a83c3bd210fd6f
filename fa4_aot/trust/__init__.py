"""Signed SKU manifests and the client's trust policy."""
