"""The one exception type users see: it becomes a single error line and exit code 2."""

EXIT_USAGE = 2


class UserError(Exception):
    """Bad input or environment: the message names the file, field, id or key at fault."""

    exit_code = EXIT_USAGE
