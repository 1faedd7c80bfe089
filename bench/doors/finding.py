"""What a fuzz target raises when a door broke its contract on one input."""


class Finding(AssertionError):
    """The door misbehaved: the message says how (not just that an input was refused)."""
