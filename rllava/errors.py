"""The base of every error rllava reports to a user as one line (bad config, data, reward file, model path)."""


class RllavaError(ValueError):
    pass


class RunFinished(Exception):
    """Not an error: the run asked for finished before and nothing is left to do (rllava.train.outputs); the
    command line prints this line and exits 0."""


class ConfigError(RllavaError):
    """A config key or value is wrong. The message names the key, the value, the choices and the fix."""

    def __init__(self, problems: str | list[str]):
        self.problems = [problems] if isinstance(problems, str) else list(problems)
        many = f"{len(self.problems)} config problems:\n" + "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(self.problems[0] if len(self.problems) == 1 else many)


def first_failure(e: BaseException) -> BaseException:
    """torch.distributed.checkpoint wraps each rank's failure in a CheckpointException (`failures`: rank ->
    (exception, traceback)); the first rank's exception is what a user needs to hear. Anything else: `e`."""
    failures = getattr(e, "failures", None) if type(e).__name__ == "CheckpointException" else None
    if not failures:
        return e
    first = next(iter(failures.values()))
    return first[0] if isinstance(first, tuple) else first
