"""Spec layer: model families build component trees from validated content."""

from __future__ import annotations

from ..content import ModelContent
from ..errors import ContentError, did_you_mean
from . import deepseek_v3
from .types import ModelSpec

FAMILIES = {deepseek_v3.FAMILY: deepseek_v3}


def load_model_spec(content: ModelContent) -> ModelSpec:
    """Build the component tree of one model from its content; ContentError on bad config."""
    family = FAMILIES.get(content.meta.family)
    where = f"{content.folder / 'model.toml'}: table 'config'"
    if family is None:
        raise ContentError([f"{content.folder / 'model.toml'}: key 'model.family': unknown family "
                            f"{content.meta.family!r}{did_you_mean(content.meta.family, FAMILIES)}"])
    return family.build_spec(content.slug, content.config, where)
