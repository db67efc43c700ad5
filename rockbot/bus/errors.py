"""What can go wrong on the bus, as exceptions the callers can tell apart."""


class BusError(Exception):
    """Base of every bus failure."""


class BusUnavailable(BusError):
    """The broker could not be reached (or did not confirm) within the allowed time."""


class NoRoute(BusError):
    """A message was addressed to a queue that does not exist (e.g. an agent that has gone)."""


class RequestTimeout(BusError):
    """No reply arrived before the request's deadline."""


class BadMessage(BusError):
    """A received message is not a JSON body this code understands."""
