"""The figures that people compare (lhc-bench's plots and the demo's summary): one backend that needs no
display, and one way to finish and write a figure."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure


def pyplot() -> ModuleType:
    """matplotlib.pyplot on the Agg backend (files only: benchmarks and the demo run without a display),
    imported on first use so that the commands that plot nothing never load matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(figure: Figure, path: Path | str, legends: Iterable[Axes] = (), dpi: int = 110) -> None:
    """Give ``legends`` a legend and a light grid, lay the figure out, write it to ``path`` (its folder
    made where missing) and free it."""
    for axes in legends:
        axes.legend()
        axes.grid(alpha=0.3)
    figure.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=dpi)
    pyplot().close(figure)
