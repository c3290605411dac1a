"""The one exception type for user mistakes.

A `VitlabError` message names the file or option, what was expected and what was found, and, where
there is one, the fix. The CLI prints it as a single line `error: ...` and exits with code 2; any other
exception is a bug and keeps its traceback.
"""


class VitlabError(ValueError):
    """A user mistake: bad option, bad file, impossible sizes. Printed as one line by the CLI."""
