"""One error hierarchy; each error writes its own one-line, user-facing text.

The CLI catches `Error` once and maps its `exit_code`; nothing else prints.
"""

from __future__ import annotations

import logging
import sys
from enum import IntEnum
from typing import NoReturn


class ExitCode(IntEnum):
    """Documented process exit codes (README, `rowgate --help`)."""

    OK = 0
    FAILED = 1  # a gate failed or errored; a bundle did not verify; a review rejected
    USAGE = 2  # bad arguments, bad row file, bad configuration
    PENDING = 3  # nothing failed but something could not run here
    STORAGE = 4  # the filesystem refused a write (no space, quota, read-only, I/O error)


class Error(Exception):
    """Base of every error rowgate reports to a user."""

    exit_code: ExitCode = ExitCode.FAILED

    def diagnostics(self) -> str:
        """One line (or a few) saying what is wrong and where."""
        text = str(self)
        cause = str(self.__cause__).strip().splitlines() if self.__cause__ is not None else []
        if cause and cause[0] not in text:
            text = f"{text} ({cause[0]})"
        return text

    def log_and_exit(self, logger: logging.Logger, raise_error: bool = False) -> NoReturn:
        """Print the diagnostics and exit; with `raise_error` (--verbose) re-raise."""
        if raise_error:
            raise self
        logger.debug("exiting %d: %s", int(self.exit_code), type(self).__name__)
        # stderr directly: the text is the interface (one line per problem), not a log record
        print(self.diagnostics(), file=sys.stderr)
        sys.exit(int(self.exit_code))


class UsageError(Error):
    """Arguments or configuration the user must fix."""

    exit_code = ExitCode.USAGE


class RowError(UsageError):
    """A row file is malformed; carries one line per problem."""

    def __init__(self, path: str, problems: list[str]):
        self.path = path
        self.problems = problems
        super().__init__("\n".join(f"{path}: {p}" for p in problems))

    def diagnostics(self) -> str:
        return str(self)  # the problems already say everything; no cause appended


class EvidenceError(Error):
    """A bundle cannot be sealed or read."""


class VerificationError(EvidenceError):
    """A bundle does not verify: names the first problem (which file, what mismatched)."""


class SigningError(Error):
    """Signing failed or no signer could be set up."""


class RepoError(UsageError):
    """The subject repository is missing or unusable."""


class SubjectError(UsageError):
    """What a subject names is refused: it resolves outside the subject, is not a regular
    file where one is expected, or is a name that cannot be a path component."""


class KeyFileError(UsageError):
    """A key file or `ROWGATE_SIGNING_KEY` is not the key it must be: a configuration error."""


class StorageError(Error):
    """The filesystem refused a write; nothing was left half-written."""

    exit_code = ExitCode.STORAGE

    def diagnostics(self) -> str:
        return str(self)  # already names the path and the system's reason
