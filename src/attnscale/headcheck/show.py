"""What ``attnscale inspect`` prints and draws: per-head rows, per-layer means, the frozen heads, heatmaps."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from attnscale.headcheck.engine import MODEL, InspectResult

__all__ = ["format_table", "plot_heatmaps"]

_WHAT_IF_TITLES = {"none": "unscaled", "inv_sqrt_d": "1/sqrt(d)", "inv_d": "1/d"}


def _title(scheme: str) -> str:
    return _WHAT_IF_TITLES.get(scheme, scheme)


def _cut(result: InspectResult) -> str:
    return f" of at most {result.max_tokens} tokens" if result.max_tokens else ""


def _header(result: InspectResult) -> list[str]:
    gqa = f", {result.kv_heads} KV heads (GQA)" if result.kv_heads != result.heads else ""
    cap = f"; soft-cap {result.softcap:g}·tanh(s/{result.softcap:g})" if result.softcap else "; no soft-cap"
    lines = [
        (f"model   {result.model}: {result.architecture}, {result.layers} layers x {result.heads} heads{gqa}, "
         f"d_k {result.head_dim}, {'causal' if result.causal else 'bidirectional'}"),
        f"scale   {result.scale:.6g} = {result.scale_source}{cap}",
        (f"text    {result.sequences} of {result.sequences_available} sequences{_cut(result)}, {result.tokens} tokens; "
         f"frozen = max weight > {result.threshold:g}; rows that see one key are left out of all but spread"),
    ]
    return lines + [f"note    {n}" for n in result.notes]


def _columns(result: InspectResult, first: str) -> list[str]:
    what = "".join(f"  {_title(w):>15}" for w in result.what_ifs)
    return [f"{first}  {'spread':>7} {'max|s|':>7} {'eff.words':>9} {'frozen':>7} {'push':>6} {what}",
            " " * (len(first) + 43) + "".join(f"  {'eff.w':>7} {'frozen':>7}" for _ in result.what_ifs)]


def _numbers(result: InspectResult, entry: dict[str, Any]) -> str:
    m = entry[MODEL]
    line = (f"  {m['spread']:>7.2f} {m['max_score']:>7.2f} {m['effective_words']:>9.2f} "
            f"{m['frozen_fraction']:>7.1%} {m['push']:>6.3f} ")
    return line + "".join(f"  {entry[w]['effective_words']:>7.2f} {entry[w]['frozen_fraction']:>7.1%}" for w in result.what_ifs)


def _frozen(result: InspectResult) -> list[str]:
    mine = result.frozen_heads.get(MODEL, [])
    lines = [f"frozen heads (more than {result.frozen_head_share:.0%} of their rows frozen)"]
    lines += [f"  layer {h['layer']}, head {h['head']}: {h['frozen_fraction']:.1%} of rows, max |score| {h['max_score']:.1f}"
              for h in mine] or ["  none under the model's scale"]
    total = len(result.rows)
    return lines + ["  what-ifs: " + ", ".join(f"{_title(w)} {len(result.frozen_heads.get(w, []))} of {total}" for w in result.what_ifs)]


def _kinds(result: InspectResult) -> list[str]:
    """The sink and previous-token heads (``core/head_kinds.py``): what trained heads look like, few effective
    words and no alarm."""
    lines = []
    for kind, title in (("sink", "sink heads (at least half of a row's weight on the first key it sees)"),
                        ("previous", "previous-token heads (at least half on the key before the row's own)")):
        marked = [h for h in result.head_kinds if h["kind"] == kind]
        lines += [f"{title}: {len(marked)} of {len(result.rows)}"]
        lines += [f"  layer {h['layer']}, head {h['head']}: {h['share']:.1%}" for h in marked]
    return lines


def format_table(result: InspectResult, per_head: bool = True) -> str:
    """The header; the per-head rows (``per_head``); per layer, the mean over its
    heads; then each frozen head, and how many the what-ifs would freeze.
    Every column is under the model's scale except the what-ifs'."""
    lines = _header(result)
    if per_head:
        lines += ["", *_columns(result, f"{'layer':>5} {'head':>4}")]
        lines += [f"{r['layer']:>5} {r['head']:>4}" + _numbers(result, r) for r in result.rows]
    lines += ["", f"per layer: the mean over its {result.heads} heads", *_columns(result, f"{'layer':>5}")]
    lines += [f"{r['layer']:>5}" + _numbers(result, r) for r in result.per_layer]
    return "\n".join(lines + [""] + _kinds(result) + [""] + _frozen(result))


def plot_heatmaps(result: InspectResult, path: Path) -> Path:
    """Layers × heads heatmaps of effective words and frozen fraction, one column per scheme
    (the model's own scale, then each what-if), on one colour scale per measure."""
    import numpy as np
    from matplotlib.ticker import MaxNLocator

    from attnscale import drawing

    plt = drawing.pyplot()
    titles = {s: f"model ({result.scale:.3g})" if s == MODEL else _title(s) for s in result.schemes}
    schemes, rows, layers, heads = list(titles), result.rows, result.layers, result.heads
    most = max(r[s]["effective_words"] for r in rows for s in schemes)  # one colour scale for all columns
    fig, axes = plt.subplots(2, len(schemes), figsize=(3.2 * len(schemes) + 1, 0.25 * layers + 5), squeeze=False)
    for col, scheme in enumerate(schemes):
        for row, (key, label, cmap, vmin, vmax) in enumerate((("effective_words", "effective words", "viridis", 1.0, most),
                                                              ("frozen_fraction", "frozen fraction", "magma", 0.0, 1.0))):
            grid = np.full((layers, heads), np.nan)
            for r in rows:
                grid[r["layer"], r["head"]] = r[scheme][key]
            ax = axes[row][col]
            im = ax.imshow(grid, aspect="auto", cmap=cmap, vmin=vmin, vmax=vmax, interpolation="nearest")
            ax.set_title(f"{label}\n{titles[scheme]}", fontsize=9)
            ax.set(xlabel="head", ylabel="layer")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.yaxis.set_major_locator(MaxNLocator(integer=True))
            fig.colorbar(im, ax=ax, shrink=0.8)
    fig.suptitle(f"{result.model}: {result.tokens} tokens", fontsize=10)
    return drawing.save(fig, path)
