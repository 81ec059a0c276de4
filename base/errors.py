"""One error type for bad input, so every entry point can print one clear line and exit non-zero."""


class ConfigError(ValueError):
    """Bad input, found before any work starts: names the field and how to fix it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field, self.message = field, message
