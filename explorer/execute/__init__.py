"""The execute stage: the reference implementation built on meta and at tiny configs, the shape trace, the
executed equation checks, real-weight checks and the cache that keeps their results."""
