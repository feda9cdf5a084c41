"""The one error type user mistakes travel in; `main()` turns it into a message and an exit code."""

from __future__ import annotations


class UserError(Exception):
    """A mistake the user can fix: names what is wrong and what to do about it.

    Raised for bad profiles, missing files and refused inputs; never for bugs. The CLI prints
    `str(error)` without a traceback and exits with `exit_code`.
    """

    def __init__(self, what: str, remedy: str, *, exit_code: int = 1) -> None:
        super().__init__(what)
        self.what = what
        self.remedy = remedy
        self.exit_code = exit_code

    def __str__(self) -> str:
        return f"{self.what}\n  remedy: {self.remedy}"
