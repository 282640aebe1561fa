"""The one exception type for mistakes a user can fix: the command line prints its message in one line
and exits with status 2, never with a traceback."""


class UserError(ValueError):
    """Bad input, named with what is wrong and how to fix it."""


class RunError(UserError):
    """A run that could not start or finish for a reason the user can fix; the message says which."""


class ConfigError(UserError):
    """A user mistake in the configuration; the message is one sentence saying what to change."""
