"""User-facing errors: a mistake in a file or flag the user passed, reported without a traceback.

The CLI turns every `UserError` into one line on stderr and exit code 2. Lives in `common`, below
every layer, so every package can raise it.
"""


class UserError(Exception):
    """Bad input from the user: the message names the file, row or key, the value and what was expected."""


class TraceError(UserError):
    """A trace file that cannot be read as the format it claims to be."""


class ConfigError(UserError):
    """A config file or option that is not valid."""
