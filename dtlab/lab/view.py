"""What every lab widget class shares: it shows its ``self.widget`` when a cell returns it."""
from __future__ import annotations


class View:
    """Mixin for the lab's widget classes: a cell ending in the object displays ``self.widget``."""

    widget: object

    def _ipython_display_(self):
        from IPython.display import display

        display(self.widget)
