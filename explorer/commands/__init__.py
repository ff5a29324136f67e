"""Verbs other than a plain build: adding a model or a variant to content/."""
