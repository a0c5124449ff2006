"""User-facing errors: one line that names the problem and the fix, no traceback."""


class UserError(Exception):
    """A problem with the user's input or environment, not a bug in trtfuse.

    The CLI prints ``error: <problem>. <fix>`` and exits with status 2.
    """

    def __init__(self, problem: str, fix: str = ""):
        self.problem = problem.rstrip(".")
        self.fix = fix
        super().__init__(str(self))

    def __str__(self) -> str:
        return f"{self.problem}. {self.fix}".strip() if self.fix else self.problem
