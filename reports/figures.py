"""Shared plotly helpers: one look for every figure, labelled axes, CDFs and escaped text.

Every figure gets its title and both axis titles (with units) here, so no figure leaves
an axis unlabelled. Text placed in figures is HTML-escaped because plotly renders a
subset of HTML in titles, legends and hover text.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from servelab.reports.html import esc

FIGURE_HEIGHT = 400
MARGIN = {"l": 70, "r": 20, "t": 56, "b": 56}
LEGEND = {"orientation": "v", "yanchor": "top", "y": 1.0, "xanchor": "left", "x": 1.02}


def style_figure(figure: go.Figure, title: str, height: int) -> go.Figure:
    """Apply the common look: escaped title top left, white template, legend above the plot."""
    figure.update_layout(
        title={"text": esc(title), "x": 0.01, "xanchor": "left", "y": 0.98, "yanchor": "top"},
        template="plotly_white",
        height=height,
        margin=MARGIN,
        legend=LEGEND,
        hovermode="closest",
        font={"size": 12},
    )
    return figure


def new_figure(
    title: str,
    x_title: str,
    y_title: str,
    *,
    height: int = FIGURE_HEIGHT,
    x_log: bool = False,
    y_log: bool = False,
) -> go.Figure:
    """An empty figure with its title and labelled axes (`x_title`, `y_title` carry units)."""
    figure = style_figure(go.Figure(), title, height)
    figure.update_xaxes(title_text=esc(x_title))
    figure.update_yaxes(title_text=esc(y_title))
    if x_log:
        figure.update_xaxes(type="log")
    if y_log:
        figure.update_yaxes(type="log")
    return figure


def stacked_figure(
    title: str, x_title: str, y_titles: Sequence[str], *, row_height: int = 150
) -> go.Figure:
    """Rows sharing one x axis, each row with its own labelled y axis."""
    rows = max(len(y_titles), 1)
    figure = make_subplots(rows=rows, cols=1, shared_xaxes=True, vertical_spacing=0.04)
    style_figure(figure, title, max(FIGURE_HEIGHT, 90 + row_height * rows))
    for row, y_title in enumerate(y_titles, start=1):
        figure.update_yaxes(title_text=esc(y_title), row=row, col=1)
    figure.update_xaxes(title_text=esc(x_title), row=rows, col=1)
    figure.update_layout(showlegend=False)
    return figure


def cdf_points(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted values and their cumulative share of requests (0..1], NaNs dropped."""
    array = np.sort(np.asarray(values, dtype=float))
    array = array[~np.isnan(array)]
    return array, np.arange(1, array.size + 1) / max(array.size, 1)


def cdf_figure(
    title: str, x_title: str, series: dict[str, np.ndarray], colors: dict[str, str]
) -> go.Figure:
    """One empirical CDF line per named series (for example one per strategy)."""
    figure = new_figure(title, x_title, "share of requests (fraction)")
    for name, values in series.items():
        x, y = cdf_points(values)
        figure.add_trace(
            go.Scatter(
                x=x,
                y=y,
                mode="lines",
                line={"shape": "hv", "color": colors.get(name)},
                name=esc(name),
            )
        )
    figure.update_yaxes(range=[0, 1.02])
    figure.update_layout(showlegend=len(series) > 1)
    return figure
