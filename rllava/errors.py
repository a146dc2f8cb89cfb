"""The base of every error rllava reports to a user as one line (bad config, data, reward file, model path)."""


class RllavaError(ValueError):
    pass
