"""Images of attention: heatmaps of every head and the combined operator, and diffusion to the sink."""

from __future__ import annotations

import math

import numpy as np

from mhjax.analysis import dag
from mhjax.plotting.style import pyplot

HORIZON = 100  # the reference fidelity horizon


def attention_grid(
    attention: np.ndarray, combined: np.ndarray | None = None, gamma: float = 0.5, min_panel: int = 128
) -> np.ndarray:
    """One RGB uint8 image (HWC) drawn by matplotlib: a titled panel per head ("head 1" ...) of
    ``attention`` (H, T, T) and one for the ``combined`` operator, rows = queries, columns = keys.

    Values in [0, 1] are shown as ``value ** gamma`` (gamma 0.5 makes small weights visible)
    through the viridis colour map, each panel upscaled (nearest) to at least ``min_panel``
    pixels. The pixels are composed here and drawn as one figure image with text titles: one
    matplotlib figure per layer stays fast (the end of training draws one per member and layer).
    """
    from matplotlib import colormaps

    panels = [(f"head {h + 1}", np.asarray(a, np.float64)) for h, a in enumerate(attention)]
    if combined is not None:
        panels.append(("combined", np.asarray(combined, np.float64)))
    T = panels[0][1].shape[-1]
    scale = max(1, math.ceil(min_panel / T))
    cols = math.ceil(math.sqrt(len(panels)))
    rows = math.ceil(len(panels) / cols)
    size, gap, title, footer = T * scale, 8, 18, 18
    width = cols * size + (cols + 1) * gap
    height = rows * (title + size) + (rows + 1) * gap + footer
    canvas = np.ones((height, width, 3))
    cmap = colormaps["viridis"]
    corners = []
    for n, (_, p) in enumerate(panels):
        r, c = divmod(n, cols)
        top, left = gap + r * (title + size + gap) + title, gap + c * (size + gap)
        rgb = cmap(np.clip(p, 0.0, 1.0) ** gamma)[..., :3]
        canvas[top : top + size, left : left + size] = np.repeat(np.repeat(rgb, scale, axis=0), scale, axis=1)
        corners.append((top, left))
    plt = pyplot()
    dpi = 100
    fig = plt.figure(figsize=(width / dpi, height / dpi), dpi=dpi)
    fig.figimage(canvas, 0, 0, origin="upper")
    for (name, _), (top, left) in zip(panels, corners):
        bold = "bold" if name == "combined" else "normal"
        fig.text((left + size / 2) / width, 1 - (top - 4) / height, name, ha="center", va="bottom", weight=bold)
    fig.text(
        gap / width,
        (footer / 2) / height,
        "rows: query, columns: key; colour: " + ("\u221aweight" if gamma == 0.5 else f"weight^{gamma:g}"),
        ha="left",
        va="center",
        fontsize="x-small",
    )
    fig.canvas.draw()
    image = np.asarray(fig.canvas.buffer_rgba())[..., :3].copy()
    plt.close(fig)
    return image


def sink_row_image(rows: np.ndarray, strip_height: int = 24, max_width: int = 800) -> np.ndarray:
    """One RGB uint8 image (HWC) of the attention rollout's sink row: one strip per layer (top:
    through layer 0), one cell per input position (left: position 0). Each strip is scaled by
    its largest entry other than the sink's own (which, at least 2^-(l+1), would hide the rest;
    it shows saturated) through the viridis colour map; strips are separated by white lines."""
    from matplotlib import colormaps

    rows = np.atleast_2d(np.asarray(rows, np.float64))
    L, T = rows.shape
    peak = np.max(rows[:, :-1] if T > 1 else rows, axis=1, keepdims=True)
    scaled = np.clip(rows / np.where(peak > 0, peak, 1.0), 0.0, 1.0)
    cell, height, gap = max(1, min(32, max_width // T)), strip_height, 2
    canvas = np.ones((L * height + (L - 1) * gap, T * cell, 3))
    strips = np.repeat(colormaps["viridis"](scaled)[..., :3], cell, axis=1)
    for l in range(L):
        canvas[l * (height + gap) : l * (height + gap) + height] = strips[l][None]
    return (canvas * 255).round().astype(np.uint8)


def diffusion_image(combined: np.ndarray, title: str = "", horizon: int = HORIZON) -> np.ndarray:
    """RGB uint8 (HWC): per layer, the signal at the sink after t steps from a few source nodes,
    and the minimax fidelity min_j max_t (sink included, as the reference)."""
    plt = pyplot()

    L, T = combined.shape[0], combined.shape[-1]
    sources = sorted({0, T // 4, T // 2, (3 * T) // 4, max(T - 2, 0)})
    fig, axes = plt.subplots(1, L, figsize=(max(3.2 * L, 4.5), 2.8), squeeze=False)
    steps = np.arange(1, horizon + 1)
    for layer, ax in enumerate(axes[0]):
        signal = dag.sink_signals_float64(combined[layer], horizon)
        for j in sources:
            ax.plot(steps, np.maximum(signal[:, j], 1e-6), label=f"from {j}")
        fidelity = signal.max(axis=0).min()
        ax.axhline(max(fidelity, 1e-6), color="k", ls="--", lw=0.8, label=f"minimax {100 * fidelity:.2f}%")
        ax.set(xscale="log", yscale="log", ylim=(1e-4, 1.5), xlabel="steps t", title=f"layer {layer}")
        if layer == 0:
            ax.set_ylabel("signal at sink")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="x-small")
    if title:
        fig.suptitle(f"{title}: diffusion to the sink (combined operator)", fontsize="small")
    fig.tight_layout()
    fig.canvas.draw()
    image = np.asarray(fig.canvas.buffer_rgba())[..., :3].copy()
    plt.close(fig)
    return image


def member_images(name: str, attention: np.ndarray, combined: np.ndarray) -> dict[str, np.ndarray]:
    """A member's end-of-training images from Experiment.attention_maps: every head's attention
    and the combined operator per layer (``attention/layer{l}``), and the signal reaching the sink
    after t steps of the combined operator (``diffusion/sink_signal``)."""
    images = {f"attention/layer{l}": attention_grid(attention[l], combined[l]) for l in range(len(attention))}
    images["diffusion/sink_signal"] = diffusion_image(combined, name)
    return images
