"""The words a check line uses for what each side of an equation check computed itself and what one side took from
the other, so that no line says more than the check did (issue 35). A reference call names its inputs with these
phrases: the mask our program built and handed to the reference, rotary angles each side computed for itself or our
angles handed to the reference (its own rotary module then never ran)."""

from __future__ import annotations

OWN_ANGLES = "rotary angles computed by each side: ours by our rope program, the reference's by its own rotary module"
GIVEN_ANGLES = ("rotary angles computed by our program and handed to the reference (its own rotary module is not run, "
                "so these angles are not checked here)")
NO_ROTARY = "no rotary angles passed"
NO_MASK = "no mask: bidirectional"
OWN_ROUTING = ("routing computed by each side: ours by our router program, the reference's by its own router module "
               "(no expert choice is handed over)")


def given_mask(window: str = "") -> str:
    """The additive causal mask: our program builds it and the reference layer is handed it (its model's mask
    function is not run); `window` says whose window it carries where it has one."""
    return "the causal mask our program built, handed to the reference" + (f" ({window})" if window else "")


def covered(*parts: str) -> str:
    """One clause per input, in the order the reference takes them."""
    return "; ".join(p for p in parts if p)


__all__ = ["OWN_ANGLES", "GIVEN_ANGLES", "NO_ROTARY", "NO_MASK", "OWN_ROUTING", "given_mask", "covered"]
