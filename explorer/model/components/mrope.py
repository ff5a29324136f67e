"""Interleaved multimodal rotary position embedding (Qwen3-VL's MRoPE): every token has three positions, time,
height and width, and each rotary pair turns with one of them. The pairs are dealt out round-robin: pair j turns
with the height position where j ≡ 1 (mod 3), with the width position where j ≡ 2 (mod 3), each while j is below
three times that axis's section, and with the time position otherwise. A text token has the same position on all
three axes, so its angles are the plain rotary ones; an image token at row r and column c of its merged grid,
starting at position s, has positions (s, s + r, s + c).

Qwen2-VL gave each axis one contiguous block of pairs (time the fastest-turning frequencies, width the slowest);
dealing them out in turn gives every axis both fast and slow frequencies.

References: Qwen2-VL (arXiv:2409.12191) for multimodal RoPE; the Qwen3-VL technical report (arXiv:2511.21631) for
the interleaved layout; transformers' models/qwen3_vl/modeling_qwen3_vl.py (Qwen3VLTextRotaryEmbedding,
Qwen3VLModel.get_rope_index) for how the reference computes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch
else:  # imported on first use: a build whose torch stages are cached never needs it
    from explorer.torch_on_first_use import torch

from explorer.model.components.base import Ctx, Run, T, ctx_colour, options, program, reference_call
from explorer.model.components.check_words import covered
from explorer.model.components.rope import RopeOptions, frequency_steps, inverse_frequencies, rope, rotate
from explorer.spec.types import Citation, Component, Dim, Shape, Step

AXES = ("t", "h", "w")
"""The three positions of a token: time, height, width."""


@dataclass(frozen=True, slots=True)
class MRopeOptions(RopeOptions):
    sections: tuple[int, ...] = (24, 20, 20)
    """mrope_section: the pairs given to the time, height and width positions (they sum to the pairs)."""


# ------------------------------------------------------------------------------------------- the numbers

def pair_axes(o: MRopeOptions, device: torch.device | None = None) -> torch.Tensor:
    """The axis (0 time, 1 height, 2 width) each rotary pair turns with: dealt out in turn, j mod 3, while j is below
    three times the axis's section; time otherwise."""
    j = torch.arange(o.pairs, device=device)
    axes = torch.zeros(o.pairs, dtype=torch.long, device=device)
    for axis in (1, 2):
        axes = torch.where((j % 3 == axis) & (j < 3 * o.sections[axis]), axis, axes)
    return axes


def multimodal_angles(run: Run, o: MRopeOptions, positions: torch.Tensor) -> torch.Tensor:
    """R_t: the angle p^pair_{t,j}·ω_j of every token and pair, [T, pairs]; positions [3, T] (time, height, width),
    or [T] for text tokens, whose three positions are one."""
    pos = run.rec("positions", positions if positions.dim() == 2 else positions[None].expand(3, -1))  # [3, T]
    omega = inverse_frequencies(run, o, positions.device)
    axes = pair_axes(o, positions.device)                                            # [pairs]
    chosen = run.rec("axes", pos.float()[axes, :].transpose(0, 1))                   # [T, pairs]: p^pair_{t,j}
    return run.rec("angles", chosen * omega[None, :])


def image_positions(text_before: int, rows: int, cols: int, text_after: int) -> torch.Tensor:
    """The (time, height, width) positions of a prompt of text, one image of rows × cols merged tokens (one frame)
    and more text, [3, T], as the reference's get_rope_index lays them out: text counts on, the image's tokens
    share its start s in time and take s + row and s + col, and the text after it resumes at s + max(rows, cols)."""
    before = torch.arange(text_before)[None].expand(3, -1)
    s = text_before
    r, c = torch.meshgrid(torch.arange(rows), torch.arange(cols), indexing="ij")
    image = torch.stack([torch.full((rows * cols,), s), s + r.reshape(-1), s + c.reshape(-1)])
    after = (s + max(rows, cols) + torch.arange(text_after))[None].expand(3, -1)
    return torch.cat([before, image, after], dim=1)


# ------------------------------------------------------------------------------------------------- spec

def mrope(ctx: Ctx, o: MRopeOptions, *, code: str, reference: str, citations: tuple[Citation, ...] = ()) -> Component:
    """The rotary angles of a Qwen3-VL text layer: the library's rope, with each pair's position read from the axis
    it is dealt to."""
    plain = rope(ctx, o, code=code, citations=citations)
    pairs = Dim("pairs", o.pairs)
    t, h, w = o.sections
    axes3 = r"p^{\mathrm{t}}_t,\ p^{\mathrm{h}}_t,\ p^{\mathrm{w}}_t"
    positions = Step(rf"{axes3}=\begin{{cases}}t,\ t,\ t & \text{{text token}}\\ t_{{\mathrm{{img}}}},\ "
                     r"t_{\mathrm{img}}+\operatorname{row}(t),\ t_{\mathrm{img}}+\operatorname{col}(t) & "
                     r"\text{image token}\end{cases}", Shape((Dim("axes", 3), T)), "positions")
    axes = Step(rf"p^{{\mathrm{{pair}}}}_{{t,j}}=\begin{{cases}}p^{{\mathrm{{h}}}}_t & j\equiv 1\ (\mathrm{{mod}}\ 3),\ "
                rf"j<{3 * h}\\ p^{{\mathrm{{w}}}}_t & j\equiv 2\ (\mathrm{{mod}}\ 3),\ j<{3 * w}\\ p^{{\mathrm{{t}}}}_t & "
                r"\text{otherwise}\end{cases}", Shape((T, pairs)), "axes")
    angles = Step(rf"{ctx_colour('R_t')}=\left(\cos p^{{\mathrm{{pair}}}}_{{t,j}}\omega_j,\ \sin p^{{\mathrm{{pair}}}}_{{t,j}}"
                  r"\omega_j\right)_{j}", Shape((T, pairs)), "angles")
    rotation = next(s for s in plain.steps if s.name == "rotate")
    steps = (*frequency_steps(o), positions, axes, angles, rotation)
    return Component(
        key="rope", title="Interleaved multimodal rotary embedding", kind="computed", code=code,
        description=f"Rotate each of the {o.pairs} feature pairs (j, j + {o.pairs}) by the position of the axis the "
                    f"pair is dealt to: {h} pairs turn with the height position, {w} with the width, {t} with time, "
                    "dealt out in turn. A text token has one position on all three axes, so its angles are the plain "
                    "rotary ones; an image token's height and width positions add its row and column.",
        inputs=plain.inputs, outputs=plain.outputs, equations=(axes, angles), steps=steps, tensors=(),
        extras=plain.extras + (("mrope_section (t, h, w)", f"{t}, {h}, {w}"),), citations=plain.citations,
        row_label="Rotary embedding (computed)", program="mrope", options=o, reference=reference,
        notes=("Positions count as the reference's get_rope_index lays them out: an image's tokens share the "
               "position t_img where the image starts in time and add their row and column in the merged grid for "
               "height and width; the text after the image resumes at t_img + max(rows, columns).",
               "Qwen2-VL's multimodal RoPE gave each axis a contiguous block of pairs, so time held the fastest "
               "frequencies and width the slowest; interleaving gives each axis frequencies across the whole range."),
    )


# -------------------------------------------------------------------------------------- program, check

@program("mrope", rotary=True)
def run_mrope(comp: Component, run: Run, positions: torch.Tensor) -> list[torch.Tensor]:
    o = options(comp, MRopeOptions)
    angles = multimodal_angles(run, o, positions)
    run.rec("rotate", rotate(torch.zeros(angles.shape[0], o.dim, device=angles.device), angles, o))
    return [angles]


EXAMPLE = (2, 3, 4, 2)
"""The check's prompt: 2 text tokens, an image of 3 × 4 merged tokens, 2 more text tokens."""


def example_words(example: tuple[int, int, int, int] = EXAMPLE) -> str:
    before, rows, cols, after = example
    return (f"{before} text tokens, an image of {rows} × {cols} merged tokens and {after} more, with (time, height, "
            "width) positions as get_rope_index lays them out")


@reference_call("mrope")
def call_mrope(comp: Component, ref, model, inputs, run: Run, ours: torch.Tensor):
    """Our angles and the reference's rotary module on the positions of a prompt holding an image (the executor's
    own positions are text positions, one on every axis, where no layout of the pairs shows)."""
    o = options(comp, MRopeOptions)
    positions = image_positions(*EXAMPLE)
    (angles,) = run_mrope(comp, Run({}), positions)
    cos, sin = ref(torch.zeros(1, positions.shape[1], 1), positions[:, None, :])
    theirs = torch.cat([cos[0, :, :o.pairs], sin[0, :, :o.pairs]], dim=-1)
    return (torch.cat([angles.cos(), angles.sin()], dim=-1), theirs,
            covered(f"cos and sin of {positions.shape[1]} × {o.pairs} angles", example_words()))


__all__ = ["MRopeOptions", "mrope", "pair_axes", "image_positions", "multimodal_angles", "AXES"]
