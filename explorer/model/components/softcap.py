"""Logit soft-capping: ℓ ← c · tanh(ℓ / c), which bounds every logit to (−c, c) while leaving small ones almost
unchanged (Gemma 2 onwards, final_logit_softcapping; the attention scores' cap is ScoresOptions.softcap in
attention.py). Here it is the LM head's last step.

References: "Gemma 2: Improving Open Language Models at a Practical Size" (arXiv:2408.00118), section 2;
transformers' models/gemma4/modeling_gemma4.py (Gemma4ForConditionalGeneration.forward).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
    import torch.nn.functional as F
else:  # imported on first use: a build whose torch stages are cached never needs it
    from explorer.torch_on_first_use import F, torch

from explorer.model.components.base import Run, fmt_num, options, program, reference_call
from explorer.spec.types import Citation, Component, Port, Step


@dataclass(frozen=True, slots=True)
class SoftcapOptions:
    cap: float


def softcapped(head: Component, cap: float, citation: Citation) -> Component:
    """The head with ℓ = c·tanh(ℓ_raw / c) as its last step."""
    raw = head.steps[0]
    raw = replace(raw, latex=raw.latex.replace(r"\ell=", r"\ell_{\mathrm{raw}}=", 1))
    c = fmt_num(cap)
    capped = Step(rf"\ell={c}\tanh\!\left(\ell_{{\mathrm{{raw}}}}/{c}\right)", raw.shape, "softcap")
    return replace(head, title=head.title + " (soft-capped)", steps=(raw, capped), equations=(raw, capped),
                   outputs=(Port(r"\ell", head.outputs[0].shape, "logits"),),
                   description=head.description + f" The logits are then soft-capped to (−{c}, {c}).",
                   citations=head.citations + (citation,), program="softcapped_head", options=SoftcapOptions(cap),
                   extras=head.extras + (("soft cap c", c),))


@program("softcapped_head", role="LM head")
def run_softcapped_head(comp: Component, run: Run, x: torch.Tensor) -> list[torch.Tensor]:
    cap = options(comp, SoftcapOptions).cap
    raw = run.rec("logits", F.linear(x, run.w("weight")))
    return [run.rec("softcap", cap * torch.tanh(raw / cap))]


@reference_call("softcapped_head")
def call_softcapped_head(comp: Component, ref, model, inputs, run: Run, ours: torch.Tensor):
    """The reference caps in the model's forward, not in lm_head: cap its lm_head's output with the model's config,
    so a cap our spec gets wrong shows."""
    (x,) = inputs
    cap = model.config.get_text_config().final_logit_softcapping
    raw = ref(x)
    return ours, raw if cap is None else cap * torch.tanh(raw / cap), "capped with the reference config's value"
