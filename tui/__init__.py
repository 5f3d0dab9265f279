"""Textual incident dashboard: reads run directories (finished or being written) only.
`make_app` builds it for the CLI and the tests alike."""

from tui.app import Dashboard, make_app

__all__ = ["Dashboard", "make_app"]
