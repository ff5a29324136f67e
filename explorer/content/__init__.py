"""The content stage: a model's recorded config, provenance, line maps and prose, read into typed values."""
