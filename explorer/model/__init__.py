"""The model stage: the component library, the families that compose it, the parameter accounting and the
notation every equation uses."""
