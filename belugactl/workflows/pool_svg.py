"""The pool map as pictures: proportional bar widths, and a standalone SVG for runbooks.

Hand-written SVG text (no dependency); every name goes through XML escaping because host names
and rack names come from the operator's manifest.
"""

from __future__ import annotations

from xml.sax.saxutils import escape, quoteattr

from belugactl.model.layout import PoolLayout, Region
from belugactl.units import format_size

KIND_COLORS = {
    "header": "#8c564b",
    "rpc": "#d62728",
    "journal": "#ff7f0e",
    "shared-kv": "#1f77b4",
    "partition": "#2ca02c",
    "unused": "#c7c7c7",
}
# Alternate partition shades so neighbouring hosts stay distinguishable.
PARTITION_SHADES = ("#2ca02c", "#98df8a")
LIGHT_FILLS = {"#98df8a", "#c7c7c7"}  # labels on these are dark for contrast


def proportional_widths(sizes: list[int], width: int, min_width: int = 1) -> list[int]:
    """Split `width` units among `sizes` proportionally, each at least `min_width` (tiny regions such
    as a 2 MiB header in an 8 TiB pool must stay visible). Largest-remainder rounding: the result
    sums to exactly `width` whenever width >= len(sizes) * min_width."""
    if not sizes:
        return []
    if width < len(sizes) * min_width:
        return [min_width] * len(sizes)
    spare = width - len(sizes) * min_width
    total = sum(sizes)
    # all-zero sizes share the width equally rather than leaving it unassigned
    shares = [spare * s / total if total > 0 else spare / len(sizes) for s in sizes]
    widths = [min_width + int(share) for share in shares]
    leftover = width - sum(widths)
    order = sorted(range(len(sizes)), key=lambda i: (-(shares[i] - int(shares[i])), i))
    for i in order[:leftover]:
        widths[i] += 1
    return widths


def region_color(region: Region, index: int) -> str:
    if region.kind == "partition":
        return PARTITION_SHADES[index % 2]
    return KIND_COLORS.get(region.kind, "#7f7f7f")


def render_svg(layout: PoolLayout, *, title: str) -> str:
    """A standalone SVG: a proportional bar of the pool, then one table row per region."""
    regions = list(layout.regions())
    bar_x, bar_y, bar_w, bar_h = 20, 50, 920, 48
    row_h = 20
    table_y = bar_y + bar_h + 40
    height = table_y + row_h * (len(regions) + 1) + 30
    widths = proportional_widths([r.size for r in regions], bar_w, min_width=4)

    out: list[str] = [
        '<?xml version="1.0" encoding="UTF-8"?>',
        f'<svg xmlns="http://www.w3.org/2000/svg" width="960" height="{height}" viewBox="0 0 960 {height}" '
        'font-family="DejaVu Sans Mono, Menlo, Consolas, monospace" font-size="12">',
        f"<title>{escape(title)}</title>",
        '<rect x="0" y="0" width="960" height="100%" fill="#ffffff"/>',
        f'<text x="{bar_x}" y="28" font-size="16" font-weight="bold">{escape(title)}</text>',
        f'<text x="{bar_x + bar_w}" y="28" text-anchor="end">'
        f"{escape(format_size(layout.pool_size))} pool, align {escape(format_size(layout.align))}, "
        f"layout {escape(layout.layout_hash[:12])}</text>",
    ]
    x = bar_x
    partition_index = 0
    for region, w in zip(regions, widths, strict=True):
        color = region_color(region, partition_index)
        if region.kind == "partition":
            partition_index += 1
        tooltip = (
            f"{region.name}: {format_size(region.offset)} .. {format_size(region.end)} ({format_size(region.size)})"
        )
        out.append(
            f'<rect x="{x}" y="{bar_y}" width="{w}" height="{bar_h}" fill="{color}" stroke="#ffffff" '
            f'stroke-width="1"><title>{escape(tooltip)}</title></rect>'
        )
        if w >= 60:
            label = region.owner if region.kind == "partition" else region.name
            out.append(
                f'<text x="{x + w / 2:.1f}" y="{bar_y + bar_h / 2 + 4}" text-anchor="middle" '
                f'fill="{"#222222" if color in LIGHT_FILLS else "#ffffff"}">'
                f"{escape(label[: max(1, w // 8)])}</text>"
            )
        x += w

    columns = (("region", 20), ("offset", 250), ("end", 390), ("size", 530), ("owner", 670))
    for name, cx in columns:
        out.append(f'<text x="{cx}" y="{table_y}" font-weight="bold">{name}</text>')
    partition_index = 0
    for row, region in enumerate(regions, start=1):
        y = table_y + row * row_h
        color = region_color(region, partition_index)
        if region.kind == "partition":
            partition_index += 1
        out.append(f'<rect x="{columns[0][1]}" y="{y - 10}" width="10" height="10" fill="{color}"/>')
        cells = (
            (columns[0][1] + 16, region.name),
            (columns[1][1], f"{region.offset:#x}"),
            (columns[2][1], f"{region.end:#x}"),
            (columns[3][1], format_size(region.size)),
            (columns[4][1], region.owner),
        )
        for cx, text in cells:
            out.append(f"<text x={quoteattr(str(cx))} y={quoteattr(str(y))}>{escape(text)}</text>")
    out.append("</svg>")
    return "\n".join(out) + "\n"
