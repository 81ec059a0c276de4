"""Assemble one self-contained, offline HTML page from headings, tables and plotly figures.

plotly.js is embedded once, in the page head; every figure is a div that calls it, so a
report opens without a network. All text that comes from configs, prompts or paths goes
through `esc`, so a strategy named `<script>` shows as text. A small script in the head
records page errors and the number of drawn figures as attributes of `<body>`
(`data-errors`, `data-rendered`, `data-figures`), which the headless-browser test reads.
"""

from __future__ import annotations

import html
import math
from dataclasses import dataclass
from pathlib import Path

import plotly.graph_objects as go
import plotly.offline

PLOT_CONFIG = {"displaylogo": False, "responsive": True}

STYLE = """
html { overflow-y: scroll; }
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 0;
  color: #1d2733; background: #f6f7f9; }
main { max-width: 1440px; margin: 0 auto; padding: 16px 24px 48px; }
h1 { font-size: 1.5rem; margin: 8px 0 4px; }
h2 { font-size: 1.2rem; margin: 28px 0 8px; border-bottom: 1px solid #d5dae1; padding-bottom: 4px; }
h3 { font-size: 1.05rem; margin: 18px 0 6px; }
p { margin: 6px 0; line-height: 1.45; }
.note { color: #5a6573; font-size: 0.9rem; }
.warn { background: #fff4e0; border-left: 4px solid #e69500; padding: 6px 10px; }
.grid { margin-top: 12px; display: grid; gap: 14px;
  grid-template-columns: repeat(auto-fit, minmax(560px, 1fr)); }
.grid.wide { grid-template-columns: 1fr; }
.card { background: #fff; border: 1px solid #dde2e8; border-radius: 6px; padding: 4px; }
.tables { display: flex; flex-wrap: wrap; gap: 18px; align-items: flex-start; }
.scroll { overflow-x: auto; max-width: 100%; }
table { border-collapse: collapse; background: #fff; font-size: 0.85rem; }
th, td { border: 1px solid #dde2e8; padding: 3px 8px; text-align: right; white-space: nowrap; }
th { background: #eef1f5; }
td:first-child, th:first-child, td.t { text-align: left; }
tr:nth-child(even) td { background: #fafbfc; }
.swatch { display: inline-block; width: 10px; height: 10px; border-radius: 2px;
  margin-right: 5px; }
"""

PROBE = """
(function () {
  var errors = [];
  function note(message) { errors.push(String(message)); }
  window.addEventListener("error", function (event) { note(event.message || event); });
  window.addEventListener("unhandledrejection", function (event) { note(event.reason); });
  var original = console.error;
  console.error = function () {
    note(Array.prototype.join.call(arguments, " "));
    original.apply(console, arguments);
  };
  function record() {
    var drawn = 0;
    document.querySelectorAll(".js-plotly-plot").forEach(function (div) {
      if (div.querySelector(".main-svg")) { drawn += 1; }
    });
    document.body.setAttribute("data-errors", JSON.stringify(errors));
    document.body.setAttribute("data-rendered", String(drawn));
    document.body.setAttribute(
      "data-figures", String(document.querySelectorAll(".plotly-graph-div").length));
  }
  function fit() {
    if (window.Plotly) {
      document.querySelectorAll(".js-plotly-plot").forEach(function (div) {
        window.Plotly.Plots.resize(div);
      });
    }
    record();
  }
  window.addEventListener("load", function () { fit(); setTimeout(record, 1000); });
})();
"""


def esc(text: object) -> str:
    """HTML-escape any value's text (quotes included)."""
    return html.escape(str(text), quote=True)


def fmt(value: object) -> str:
    """A number for a table: 4 significant digits, thousands separated; `–` when missing."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if math.isinf(value):
            return "∞" if value > 0 else "−∞"
        return f"{value:,.0f}" if 10_000 <= abs(value) < 1e7 else f"{value:.4g}"
    return str(value)


@dataclass(frozen=True)
class Link:
    """A table cell that links to another file (both parts escaped)."""

    text: str
    href: str


@dataclass(frozen=True)
class Swatch:
    """A table cell with a colour swatch before its text, matching the figures' colour."""

    text: str
    color: str


Cell = str | int | float | None | Link | Swatch


def _cell(value: Cell) -> str:
    if isinstance(value, Link):
        return f'<a href="{esc(value.href)}">{esc(value.text)}</a>'
    if isinstance(value, Swatch):
        return (
            f'<span class="swatch" style="background:{esc(value.color)}"></span>{esc(value.text)}'
        )
    return esc(fmt(value))


def _td(value: Cell) -> str:
    """A cell: numbers right-aligned (the default), text left-aligned."""
    numeric = value is None or isinstance(value, int | float)
    return f"<td>{_cell(value)}</td>" if numeric else f'<td class="t">{_cell(value)}</td>'


def table_html(headers: list[str], rows: list[list[Cell]], caption: str = "") -> str:
    """A table's HTML with every cell escaped; place it with `Page.tables`."""
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(_td(c) for c in r) + "</tr>" for r in rows)
    title = f"<h3>{esc(caption)}</h3>" if caption else ""
    return f'<div class="scroll">{title}<table><tr>{head}</tr>{body}</table></div>'


class Page:
    """An HTML page built part by part; `render` embeds plotly.js once in the head."""

    def __init__(self, title: str) -> None:
        self.title = title
        self.parts: list[str] = []
        self.figure_count = 0

    def heading(self, text: str, level: int = 2) -> None:
        """A section heading (h1..h3)."""
        self.parts.append(f"<h{level}>{esc(text)}</h{level}>")

    def paragraph(self, text: str, css_class: str = "") -> None:
        """A paragraph of plain text, escaped; `css_class` is `note` or `warn` or empty."""
        attribute = f' class="{esc(css_class)}"' if css_class else ""
        self.parts.append(f"<p{attribute}>{esc(text)}</p>")

    def tables(self, tables: list[str]) -> None:
        """Tables side by side, wrapping on narrow screens."""
        self.parts.append('<div class="tables">' + "".join(tables) + "</div>")

    def figures(self, figures: list[go.Figure], wide: bool = False) -> None:
        """Figures in a responsive grid (two columns on a laptop screen; one when `wide`)."""
        cards = []
        for figure in figures:
            self.figure_count += 1
            div = figure.to_html(
                full_html=False,
                include_plotlyjs=False,
                config=PLOT_CONFIG,
                div_id=f"figure-{self.figure_count}",
                default_height=f"{figure.layout.height or 400}px",
            )
            cards.append(f'<div class="card">{div}</div>')
        grid = "grid wide" if wide else "grid"
        self.parts.append(f'<div class="{grid}">' + "".join(cards) + "</div>")

    def render(self) -> str:
        """The whole page as one string."""
        return (
            '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{esc(self.title)}</title><style>{STYLE}</style>"
            f"<script>{PROBE}</script>"
            f'<script type="text/javascript">{plotly.offline.get_plotlyjs()}</script>'
            f"</head><body><main><h1>{esc(self.title)}</h1>"
            + "\n".join(self.parts)
            + "</main></body></html>\n"
        )

    def write(self, path: Path) -> Path:
        """Write the page atomically (temporary file, then rename) and return its path."""
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(path.name + ".partial")
        partial.write_text(self.render(), encoding="utf-8")
        partial.replace(path)
        return path
