"""Keeping secrets out of records and logs: every known secret value is masked."""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Iterable, Mapping

logger = logging.getLogger(__name__)

#: What a masked secret is replaced with.
MASK = "***"
#: Environment variables whose values are treated as secrets besides the named ones.
_SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIALS?)$", re.IGNORECASE)
#: Shorter values are not masked: they would mangle ordinary text ("1", "true"). Values
#: found only by their variable's name must be longer (``SORT_KEY=assistant`` is no secret).
_MIN_SECRET_LENGTH = 8
_MIN_GUESSED_LENGTH = 16


class Redactor:
    """Masks secret values in text: API keys from the environment and any given ones."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        """Hold the secrets to mask (values shorter than 8 characters are ignored)."""
        values: set[str] = set()
        for secret in secrets:
            if secret and len(secret) >= _MIN_SECRET_LENGTH:
                values.add(secret)
                values.add(json.dumps(secret)[1:-1])  # as it appears inside a JSON string
        # Longest first, so a secret containing another one is masked whole.
        self._secrets = sorted(values, key=len, reverse=True)

    @classmethod
    def from_environment(
        cls, names: Iterable[str] = (), environ: Mapping[str, str] | None = None
    ) -> Redactor:
        """Secrets from the environment: the named variables, and every variable whose
        name ends in KEY, TOKEN, SECRET, PASSWORD or CREDENTIALS and whose value has at
        least 16 characters. A named value shorter than 16 characters without a digit
        ("anything", "not-needed": placeholder keys of local servers) is an ordinary
        word that masking would blank out of every record, so it is not masked."""
        environ = os.environ if environ is None else environ
        wanted = set(names)
        return cls(
            value
            for name, value in environ.items()
            if (name in wanted and _looks_secret(name, value))
            or (_SECRET_NAME.search(name) and len(value) >= _MIN_GUESSED_LENGTH)
        )

    def __call__(self, text: str) -> str:
        """``text`` with every secret replaced by ``***``."""
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, MASK)
        return text

    def __bool__(self) -> bool:
        return bool(self._secrets)


def _looks_secret(name: str, value: str) -> bool:
    """Whether the value of a variable named as holding a key is worth masking."""
    if len(value) >= _MIN_GUESSED_LENGTH or (len(value) >= _MIN_SECRET_LENGTH and any(c.isdigit() for c in value)):
        return True
    if len(value) >= _MIN_SECRET_LENGTH:
        logger.warning("%s looks like a placeholder key (short, no digits): it is not masked in records", name)
    return False


#: Environment variables named as holding API keys (policy files' ``api_key_env``) so far.
_SECRET_VARIABLES: set[str] = set()


def add_secret_variables(names: Iterable[str]) -> None:
    """Treat the values of these environment variables as secrets in every record file
    written from now on (besides the secret-looking variables found by name)."""
    _SECRET_VARIABLES.update(name for name in names if name)


def file_redactor() -> Redactor:
    """What every record file masks by default: the values of the variables named by
    ``add_secret_variables`` and of secret-looking variables, read from the environment now."""
    return Redactor.from_environment(_SECRET_VARIABLES)


class RedactingFilter(logging.Filter):
    """A logging filter that masks secrets in every record it passes."""

    def __init__(self, redactor: Redactor) -> None:
        """Mask with ``redactor``."""
        super().__init__()
        self.redactor = redactor

    def filter(self, record: logging.LogRecord) -> bool:
        """Render the message, mask it, and keep the record."""
        message = record.getMessage()
        masked = self.redactor(message)
        if masked != message:
            record.msg, record.args = masked, None
        if record.exc_info and record.exc_info[1] is not None:
            record.exc_text = self.redactor(logging.Formatter().formatException(record.exc_info))
            record.exc_info = None
        return True
