"""What can go wrong on the bus, as exceptions the callers can tell apart."""


class BusError(Exception):
    """Base of every bus failure."""


class BusUnavailable(BusError):
    """The broker could not be reached (or did not confirm) within the allowed time."""


class NoRoute(BusError):
    """A message was addressed to a queue that does not exist (e.g. an agent that has gone)."""


class Nacked(BusError):
    """The broker took a message but would not keep it (its queue refuses more: an overflow of reject-publish).

    Sending it again gets the same answer; a reply refused so is dropped, never retried by requeueing
    the request it answers (that would run the request again, for nothing)."""


class RequestTimeout(BusError):
    """No reply arrived before the request's deadline."""


class NotAccepted(RequestTimeout):
    """No consumer said it took the request within the wait the request gave for that (see `Bus.request`)."""


class AccessRefused(BusError):
    """The broker refused this connection's user something its permissions do not allow."""


class InUse(AccessRefused):
    """A queue another connection consumes exclusively (another process holds that reply slot)."""


class BadMessage(BusError):
    """A received message is not a JSON body this code understands; it is dead-lettered, never retried."""


class TooLarge(BadMessage):
    """A body over the size its reader accepts, refused before it is parsed (or before it is sent)."""


class Refused(BusError):
    """A consumer will not handle this message (wrong sender, no reply queue of the sender's own, ...).

    The bus dead-letters it with a log line naming the reason; it is never requeued.
    """
