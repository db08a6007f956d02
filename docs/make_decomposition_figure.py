#!/usr/bin/env python3
"""Draws docs/decomposition.svg: a 2-D field split over a process grid, and its halos.

Standard library only. Run from anywhere:

    python3 docs/make_decomposition_figure.py [output.svg]

The split and the rank numbering follow ShardTensor's Decomposition exactly:
  - balanced split: along an axis of N cells over P parts, every part gets N / P cells and
    the first N % P parts one more (balanced_split_points);
  - ranks are numbered row-major over the process grid, the last axis fastest
    (rank = cx * grid[1] + cy for a 2-D grid);
  - a neighbour past an open boundary does not exist; on a periodic axis it wraps.

Three panels:
  (a) a 10 x 7 field on a 3 x 2 grid, open boundaries, with the width-1 ghost ring of rank 2;
  (b) rank 2's own array (owned cells plus ghosts) in local indices, and the messages of its
      halo exchange plan, one per neighbour and direction, corners included;
  (c) the same field with both axes periodic and the ghost ring of rank 0, whose ghosts on
      the outside come from the far side of the field.
"""

import os
import sys
from xml.sax.saxutils import escape

GLOBAL_EXTENT = (10, 7)  # x (dim 0, drawn as rows, downwards), y (dim 1, columns, rightwards)
PROCESS_GRID = (3, 2)
WIDTH = 1  # ghost width on every side

# One colour per rank (ColorBrewer Set3), and a darker edge of the same hue.
RANK_FILL = ["#8dd3c7", "#ffffb3", "#bebada", "#fb8072", "#80b1d3", "#fdb462"]
RANK_EDGE = ["#2b8c7e", "#b3a600", "#6a5fa8", "#c0392b", "#2e6e9e", "#c46f00"]
FONT = "DejaVu Sans, Helvetica, Arial, sans-serif"
MONO = "DejaVu Sans Mono, Menlo, Consolas, monospace"
CELL = 32  # pixels per cell


# --------------------------------------------------------------------------- decomposition


def balanced_split_points(extent, parts):
    base, remainder = divmod(extent, parts)
    return [i * base + min(i, remainder) for i in range(parts + 1)]


class Decomposition:
    """The 2-D subset of shardtensor::Decomposition the figure needs."""

    def __init__(self, extent, grid, periodic=(False, False)):
        self.extent = extent
        self.grid = grid
        self.periodic = periodic
        self.points = [balanced_split_points(extent[d], grid[d]) for d in range(2)]

    def nranks(self):
        return self.grid[0] * self.grid[1]

    def coords_of(self, rank):
        return (rank // self.grid[1], rank % self.grid[1])

    def rank_of(self, coords):
        return coords[0] * self.grid[1] + coords[1]

    def box(self, rank):
        """((x0, x1), (y0, y1)), half-open."""
        c = self.coords_of(rank)
        return tuple((self.points[d][c[d]], self.points[d][c[d] + 1]) for d in range(2))

    def wrap(self, cell):
        """The cell wrapped along periodic axes, or None past an open boundary."""
        out = []
        for d in range(2):
            i = cell[d]
            if not 0 <= i < self.extent[d]:
                if not self.periodic[d]:
                    return None
                i %= self.extent[d]
            out.append(i)
        return tuple(out)

    def owner(self, cell):
        coords = []
        for d in range(2):
            p = self.points[d]
            coords.append(max(k for k in range(len(p) - 1) if p[k] <= cell[d]))
        return self.rank_of(coords)

    def neighbor(self, rank, direction):
        c = list(self.coords_of(rank))
        for d in range(2):
            c[d] += direction[d]
            if not 0 <= c[d] < self.grid[d]:
                if not self.periodic[d]:
                    return None
                c[d] %= self.grid[d]
        return self.rank_of(c)


def ghost_cells(decomposition, rank, width):
    """Global (unwrapped) indices of the ghost cells of `rank`, with their direction."""
    (x0, x1), (y0, y1) = decomposition.box(rank)
    out = []
    for x in range(x0 - width, x1 + width):
        for y in range(y0 - width, y1 + width):
            if x0 <= x < x1 and y0 <= y < y1:
                continue
            direction = (-1 if x < x0 else (1 if x >= x1 else 0),
                         -1 if y < y0 else (1 if y >= y1 else 0))
            out.append(((x, y), direction))
    return out


# --------------------------------------------------------------------------- SVG helpers


class Svg:
    def __init__(self, width, height):
        self.width = width
        self.height = height
        self.items = []

    def add(self, text):
        self.items.append(text)

    def rect(self, x, y, w, h, fill="none", stroke="none", width=1.0, dash=None, opacity=None,
             extra=""):
        attrs = f'x="{x:.1f}" y="{y:.1f}" width="{w:.1f}" height="{h:.1f}" fill="{fill}"'
        attrs += f' stroke="{stroke}" stroke-width="{width}"'
        if dash:
            attrs += f' stroke-dasharray="{dash}"'
        if opacity is not None:
            attrs += f' fill-opacity="{opacity}"'
        self.add(f"<rect {attrs} {extra}/>")

    def text(self, x, y, s, size=12, anchor="middle", weight="normal", fill="#222",
             style="normal", rotate=None, baseline="central", family=FONT):
        transform = f' transform="rotate({rotate} {x:.1f} {y:.1f})"' if rotate else ""
        self.add(f'<text x="{x:.1f}" y="{y:.1f}" font-family="{family}" font-size="{size}" '
                 f'xml:space="preserve" '
                 f'text-anchor="{anchor}" dominant-baseline="{baseline}" font-weight="{weight}" '
                 f'font-style="{style}" fill="{fill}"{transform}>{escape(s)}</text>')

    def line(self, x1, y1, x2, y2, stroke="#222", width=1.0, dash=None, marker=False):
        attrs = (f'x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" stroke="{stroke}" '
                 f'stroke-width="{width}"')
        if dash:
            attrs += f' stroke-dasharray="{dash}"'
        if marker:
            attrs += ' marker-end="url(#arrow)"'
        self.add(f"<line {attrs}/>")

    def path(self, d, stroke="#222", width=1.5, marker=True, dash=None):
        attrs = f'd="{d}" fill="none" stroke="{stroke}" stroke-width="{width}"'
        if dash:
            attrs += f' stroke-dasharray="{dash}"'
        if marker:
            attrs += ' marker-end="url(#arrow)"'
        self.add(f"<path {attrs}/>")

    def render(self):
        defs = [
            '<marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" '
            'markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" '
            'fill="#222"/></marker>',
            '<pattern id="hatch" patternUnits="userSpaceOnUse" width="6" height="6" '
            'patternTransform="rotate(45)"><line x1="0" y1="0" x2="0" y2="6" '
            'stroke="#000" stroke-width="1.6" stroke-opacity="0.45"/></pattern>',
        ]
        head = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{self.width}" '
                f'height="{self.height}" viewBox="0 0 {self.width} {self.height}">')
        return "\n".join([head, "<defs>", *defs, "</defs>",
                          f'<rect width="{self.width}" height="{self.height}" fill="white"/>',
                          *self.items, "</svg>", ""])


class FieldPanel:
    """Draws a global field with a one-cell margin all round for ghost cells outside it."""

    def __init__(self, svg, decomposition, left, top):
        self.svg = svg
        self.d = decomposition
        self.left = left  # screen position of global cell (-1, -1)
        self.top = top

    def xy(self, cell):
        """Screen (left, top) of a global cell (x = row, y = column)."""
        return (self.left + (cell[1] + 1) * CELL, self.top + (cell[0] + 1) * CELL)

    def field_box(self):
        x, y = self.xy((0, 0))
        return x, y, self.d.extent[1] * CELL, self.d.extent[0] * CELL

    def draw_owned(self, highlight):
        s, d = self.svg, self.d
        for x in range(d.extent[0]):
            for y in range(d.extent[1]):
                px, py = self.xy((x, y))
                s.rect(px, py, CELL, CELL, fill=RANK_FILL[d.owner((x, y))], stroke="#999",
                       width=0.6)
        for r in range(d.nranks()):
            (x0, x1), (y0, y1) = d.box(r)
            px, py = self.xy((x0, y0))
            w, h = (y1 - y0) * CELL, (x1 - x0) * CELL
            s.rect(px, py, w, h, stroke="#333" if r != highlight else "#000",
                   width=1.6 if r != highlight else 3.2)

    def draw_labels(self, avoid_rank=None):
        """Rank, grid coordinates and extents of every shard on a light chip, placed as near
        the shard's centre as it can be without covering the ghost ring of `avoid_rank`."""
        s, d = self.svg, self.d
        avoid = set()
        if avoid_rank is not None:
            avoid = {cell for cell, _ in ghost_cells(d, avoid_rank, WIDTH)}
        half_w, half_h = 31, 19
        for r in range(d.nranks()):
            (x0, x1), (y0, y1) = d.box(r)
            px, py = self.xy((x0, y0))
            w, h = (y1 - y0) * CELL, (x1 - x0) * CELL
            best = None
            step = CELL / 8
            for i in range(int(h / step) + 1):
                for j in range(int(w / step) + 1):
                    cx, cy = px + j * step, py + i * step
                    if not (px + half_w <= cx <= px + w - half_w and
                            py + half_h <= cy <= py + h - half_h):
                        continue
                    covered = any(
                        self.xy(c)[0] < cx + half_w and cx - half_w < self.xy(c)[0] + CELL and
                        self.xy(c)[1] < cy + half_h and cy - half_h < self.xy(c)[1] + CELL
                        for c in avoid)
                    distance = (cx - px - w / 2) ** 2 + (cy - py - h / 2) ** 2
                    key = (covered, distance)
                    if best is None or key < best[0]:
                        best = (key, cx, cy)
            _, cx, cy = best
            s.rect(cx - half_w, cy - half_h, 2 * half_w, 2 * half_h, fill="white",
                   stroke="#666", width=0.6, opacity=0.85, extra='rx="5"')
            s.text(cx, cy - 7, f"rank {r}", size=13, weight="bold")
            c = d.coords_of(r)
            s.text(cx, cy + 10, f"({c[0]},{c[1]}) {x1 - x0}x{y1 - y0}", size=10, fill="#444")

    def draw_ticks(self):
        s, d = self.svg, self.d
        fx, fy, fw, fh = self.field_box()
        for y in range(d.extent[1]):
            px, _ = self.xy((0, y))
            s.text(px + CELL / 2, self.top - 8, str(y), size=10, fill="#555")
        for x in range(d.extent[0]):
            _, py = self.xy((x, 0))
            s.text(self.left - 8, py + CELL / 2, str(x), size=10, fill="#555", anchor="end")
        axis_arrows(s, fx + fw / 2, self.top - 26, self.left - 30, fy + fh / 2,
                    "y (dim 1)", "x (dim 0)")

    def draw_ghost(self, cell, source_rank, label=None):
        """A ghost cell: source colour, hatched, labelled with the rank it comes from."""
        s = self.svg
        px, py = self.xy(cell)
        inside = self.d.wrap(cell) == cell
        if not inside:  # outside the field: draw the source colour underneath
            s.rect(px, py, CELL, CELL, fill=RANK_FILL[source_rank])
        s.rect(px, py, CELL, CELL, fill="url(#hatch)")
        s.rect(px + 1, py + 1, CELL - 2, CELL - 2, stroke=RANK_EDGE[source_rank], width=1.4,
               dash="3,2")
        s.text(px + CELL / 2, py + CELL / 2, label if label is not None else str(source_rank),
               size=9 if label else 11, weight="bold", fill="#111")

    def draw_padding(self, cell):
        s = self.svg
        px, py = self.xy(cell)
        s.rect(px + 1, py + 1, CELL - 2, CELL - 2, fill="#f0f0f0", stroke="#888", width=1.2,
               dash="3,2")
        s.text(px + CELL / 2, py + CELL / 2, "pad", size=9, fill="#666")

    def draw_ghost_ring(self, rank):
        for cell, _ in ghost_cells(self.d, rank, WIDTH):
            owner_cell = self.d.wrap(cell)
            if owner_cell is None:
                self.draw_padding(cell)
            elif owner_cell == cell:
                self.draw_ghost(cell, self.d.owner(cell))
            else:  # wrapped: name the global cell it copies
                self.draw_ghost(cell, self.d.owner(owner_cell),
                                f"{owner_cell[0]},{owner_cell[1]}")
        (x0, x1), (y0, y1) = self.d.box(rank)
        px, py = self.xy((x0 - WIDTH, y0 - WIDTH))
        self.svg.rect(px, py, (y1 - y0 + 2 * WIDTH) * CELL, (x1 - x0 + 2 * WIDTH) * CELL,
                      stroke="#000", width=1.6, dash="6,3")


def axis_arrows(svg, yx, yy, xx, xy, y_label, x_label):
    """Axis titles with arrows: y runs right along the top, x runs down the left side."""
    svg.text(yx, yy, y_label, size=12, fill="#333")
    svg.line(yx + 34, yy, yx + 64, yy, stroke="#333", width=1.2, marker=True)
    svg.text(xx, xy, x_label, size=12, fill="#333", rotate=90)
    svg.line(xx, xy + 34, xx, xy + 64, stroke="#333", width=1.2, marker=True)


def panel_title(svg, x, y, letter, title, subtitle):
    svg.text(x, y, f"({letter}) {title}", size=15, anchor="start", weight="bold")
    svg.text(x, y + 19, subtitle, size=11, anchor="start", fill="#444")


# --------------------------------------------------------------------------- the figure


def local_panel(svg, d, rank, left, top):
    """Rank `rank`'s allocation in local indices, and the messages of its plan."""
    (x0, x1), (y0, y1) = d.box(rank)
    nx, ny = x1 - x0 + 2 * WIDTH, y1 - y0 + 2 * WIDTH
    for i in range(nx):
        for j in range(ny):
            px, py = left + j * CELL, top + i * CELL
            g = (x0 - WIDTH + i, y0 - WIDTH + j)
            if x0 <= g[0] < x1 and y0 <= g[1] < y1:
                svg.rect(px, py, CELL, CELL, fill=RANK_FILL[rank], stroke="#999", width=0.6)
                svg.text(px + CELL / 2, py + CELL / 2, f"{g[0]},{g[1]}", size=8, fill="#555")
                continue
            owner_cell = d.wrap(g)
            if owner_cell is None:
                svg.rect(px + 1, py + 1, CELL - 2, CELL - 2, fill="#f0f0f0", stroke="#888",
                         width=1.2, dash="3,2")
                svg.text(px + CELL / 2, py + CELL / 2, "pad", size=9, fill="#666")
            else:
                src = d.owner(owner_cell)
                svg.rect(px, py, CELL, CELL, fill=RANK_FILL[src])
                svg.rect(px, py, CELL, CELL, fill="url(#hatch)")
                svg.rect(px + 1, py + 1, CELL - 2, CELL - 2, stroke=RANK_EDGE[src], width=1.4,
                         dash="3,2")
                svg.text(px + CELL / 2, py + CELL / 2, str(src), size=11, weight="bold")
    svg.rect(left + WIDTH * CELL, top + WIDTH * CELL, (y1 - y0) * CELL, (x1 - x0) * CELL,
             stroke="#000", width=3.2)
    svg.rect(left, top, ny * CELL, nx * CELL, stroke="#000", width=1.6, dash="6,3")
    for j in range(ny):
        svg.text(left + j * CELL + CELL / 2, top - 8, str(j), size=10, fill="#555")
    for i in range(nx):
        svg.text(left - 8, top + i * CELL + CELL / 2, str(i), size=10, fill="#555", anchor="end")
    axis_arrows(svg, left + ny * CELL / 2, top - 24, left - 34, top + nx * CELL / 2 - 20,
                "local j", "local i")

    # The facts a user reads off a ShardTensor for this rank.
    y = top + nx * CELL + 22
    facts = [
        f"allocated_extent(d): {nx}, {ny};  local_extent(d): {x1 - x0}, {y1 - y0}",
        f"global_box(): lower ({x0},{y0}), extent ({x1 - x0},{y1 - y0})",
        f"interior_box(): lower ({WIDTH},{WIDTH}), extent ({x1 - x0},{y1 - y0})",
        f"to_global(0, i) = i + {x0} - {WIDTH}    to_global(1, j) = j + {y0} - {WIDTH}",
    ]
    for line in facts:
        svg.text(left - 40, y, line, size=10.5, anchor="start", fill="#222")
        y += 16

    y += 10
    svg.text(left - 40, y, f"HaloExchange::messages() of rank {rank}:", size=11,
             anchor="start", weight="bold")
    y += 17
    names = {(-1, 0): "face", (1, 0): "face", (0, -1): "face", (0, 1): "face"}
    for dx in (-1, 0, 1):
        for dy in (-1, 0, 1):
            if (dx, dy) == (0, 0):
                continue
            direction = (dx, dy)
            neighbor = d.neighbor(rank, direction)
            n_cells = (WIDTH if dx else x1 - x0) * (WIDTH if dy else y1 - y0)
            kind = names.get(direction, "corner")
            text = f"({dx:+d},{dy:+d}) {kind:<6}"
            if neighbor is None:
                line = f"{text} open boundary: no message"
                colour = "#888"
            else:
                line = f"{text} rank {neighbor}: {n_cells} cell(s) each way"
                colour = "#222"
            svg.text(left - 40, y, line.replace("+0", " 0"), size=10, anchor="start",
                     fill=colour, family=MONO)
            y += 15
    return y


def build():
    d_open = Decomposition(GLOBAL_EXTENT, PROCESS_GRID)
    d_periodic = Decomposition(GLOBAL_EXTENT, PROCESS_GRID, periodic=(True, True))
    field_w = (GLOBAL_EXTENT[1] + 2) * CELL
    field_h = (GLOBAL_EXTENT[0] + 2) * CELL

    svg = Svg(1180, 790)
    svg.text(20, 24, "Domain decomposition and halos: a 10 x 7 field on a 3 x 2 process grid, "
             "ghost width 1", size=17, anchor="start", weight="bold")
    split_x = "+".join(str(b - a) for a, b in zip(d_open.points[0], d_open.points[0][1:]))
    split_y = "+".join(str(b - a) for a, b in zip(d_open.points[1], d_open.points[1][1:]))
    svg.text(20, 46, f"Balanced split: x: 10 = {split_x}, y: 7 = {split_y} (the first N % P "
             "parts get one extra cell).  Ranks row-major over the grid, last axis fastest: "
             "rank = 2 * cx + cy.", size=12, anchor="start", fill="#333")

    # (a) open boundaries, rank 2's ghost ring.
    top = 150
    left_a = 70
    panel_title(svg, 20, 80, "a", "Open boundaries: ghosts of rank 2",
                "hatched = ghost copy; number = rank it comes from")
    a = FieldPanel(svg, d_open, left_a, top)
    a.draw_owned(highlight=2)
    a.draw_ghost_ring(2)
    a.draw_labels(avoid_rank=2)
    a.draw_ticks()

    # (b) rank 2's local array.
    left_b = 470
    panel_title(svg, 400, 80, "b", "Rank 2's View, local indices",
                "owned cells (bold box) + ghosts; labels: global x,y")
    bottom_b = local_panel(svg, d_open, 2, left_b, top + CELL)

    # (c) periodic, rank 0's ghost ring.
    left_c = 860
    panel_title(svg, 810, 80, "c", "Periodic x and y: ghosts of rank 0",
                "outside ghosts copy the far side (label: global x,y)")
    c = FieldPanel(svg, d_periodic, left_c, top)
    c.draw_owned(highlight=0)
    c.draw_ghost_ring(0)
    c.draw_labels(avoid_rank=0)
    c.draw_ticks()
    fx, fy, fw, fh = c.field_box()
    # x wraps: row 9 is copied into ghost row -1.
    r9 = c.xy((9, 6))
    rm1 = c.xy((-1, 4))
    sx, sy = fx + fw + 2, r9[1] + CELL / 2
    ex, ey = rm1[0] + CELL + 3, rm1[1] + CELL / 2
    svg.path(f"M{sx:.1f},{sy:.1f} C{sx + 60:.1f},{sy:.1f} {sx + 60:.1f},{ey:.1f} "
             f"{ex:.1f},{ey:.1f}")
    svg.text(sx + 50, (sy + ey) / 2, "periodic x: row 9 \u2192 row -1", size=11, rotate=-90,
             fill="#222")
    # y wraps: column 6 is copied into ghost column -1.
    c6 = c.xy((9, 6))
    cm1 = c.xy((5, -1))
    sx, sy = c6[0] + CELL / 2, fy + fh + 2
    ex, ey = cm1[0] + CELL / 2, cm1[1] - 3
    svg.path(f"M{sx:.1f},{sy:.1f} C{sx:.1f},{sy + 45:.1f} {ex:.1f},{sy + 45:.1f} "
             f"{ex:.1f},{ey + 40:.1f} L{ex:.1f},{ey:.1f}")
    svg.text((sx + ex) / 2 + 10, sy + 44, "periodic y: column 6 \u2192 column -1", size=11)

    # Legend and caption.
    ly = max(top + field_h + 60, bottom_b + 20)
    svg.text(20, ly, "Legend", size=13, anchor="start", weight="bold")
    x = 90
    for r in range(6):
        svg.rect(x, ly - 8, 16, 16, fill=RANK_FILL[r], stroke="#333")
        svg.text(x + 22, ly, f"rank {r}", size=11, anchor="start")
        x += 72
    svg.rect(x, ly - 8, 16, 16, fill=RANK_FILL[3])
    svg.rect(x, ly - 8, 16, 16, fill="url(#hatch)", stroke=RANK_EDGE[3], dash="3,2")
    svg.text(x + 22, ly, "ghost cell, copy of its owner's value", size=11, anchor="start")
    x += 240
    svg.rect(x, ly - 8, 16, 16, fill="#f0f0f0", stroke="#888", dash="3,2")
    svg.text(x + 22, ly, "ghost past an open boundary (not exchanged)", size=11,
             anchor="start")

    caption = [
        "One halo exchange fills every ghost cell in a single round: each rank sends one message "
        "per neighbour and direction, faces and corners alike",
        "(rank 2 gets its corner ghosts straight from the diagonal neighbours 1 and 5). Ghosts "
        "past an open boundary are left untouched; the layer fills them (padding).",
        "On a periodic axis the neighbour wraps around. reverse_accumulate() runs the same "
        "messages backwards: ghost values are added into their owners and zeroed.",
    ]
    y = ly + 28
    for line in caption:
        svg.text(20, y, line, size=12, anchor="start", fill="#222")
        y += 18
    svg.height = int(y + 10)
    return svg.render()


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "decomposition.svg")
    with open(out, "w", encoding="utf-8") as f:
        f.write(build())
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
