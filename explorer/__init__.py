"""explorer: a static site that explains LLM architectures component by component.

Pipeline stages, one module each: content (load) -> spec (component tree) -> account (parameters)
-> checkpoint/reconcile (stored tensors) -> views -> render.
"""
