"""Typed errors at the edges. The HTTP layer maps each class to a status in one
table (`STATUS`); the client maps the wire `code` back to the class, so a caller
of the SDK or CLI catches the same exceptions the server raised."""
from __future__ import annotations


class SchedulerError(Exception):
    """The scheduler could not do what was asked."""

    code = "error"

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or self.code).strip())

    @property
    def message(self) -> str:
        return str(self.args[0])


class InvalidRequest(SchedulerError):
    """The request is malformed."""

    code = "invalid_request"


class InvalidJob(InvalidRequest):
    """The job definition is not valid."""

    code = "invalid_job"


class LimitExceeded(InvalidRequest):
    """The request asks for more than a configured limit allows."""

    code = "limit_exceeded"


class TooLarge(SchedulerError):
    """The request body or payload is larger than allowed."""

    code = "too_large"


class NotFound(SchedulerError):
    """No such job or run."""

    code = "not_found"


class Conflict(SchedulerError):
    """The object is not in a state that allows this change."""

    code = "conflict"


class StaleFence(Conflict):
    """The lease is no longer held by this worker with this fence."""

    code = "stale_fence"


class Unavailable(SchedulerError):
    """No leader or no quorum right now; retry shortly."""

    code = "unavailable"


class OutcomeUnknown(Unavailable):
    """The write may or may not have been applied; retry it with the same id."""

    code = "outcome_unknown"


class Elsewhere(Unavailable):
    """The data group a request needs has no replica on this node. The API forwards the
    request to a node that holds one (api/forward.py); a client sees this only when a
    forwarded request found the placement moved under it: retry."""

    code = "elsewhere"

    def __init__(self, group_id: int) -> None:
        super().__init__(f"group {group_id} has no replica on this node (the placement is moving): retry")
        self.group_id = group_id


class Unauthorized(SchedulerError):
    """Missing or bad credentials."""

    code = "unauthorized"


class Forbidden(SchedulerError):
    """Authenticated, but the token's scopes do not allow this call."""

    code = "forbidden"


class CrossSiteRefused(Forbidden):
    """A page of another site may not change anything on this node."""

    code = "cross_site"


class MisdirectedHost(SchedulerError):
    """The request names a Host this node does not answer to."""

    code = "misdirected_host"


class UnsupportedMediaType(SchedulerError):
    """The body is not declared as a type this route takes."""

    code = "unsupported_media_type"


class SlowRequest(SchedulerError):
    """The client sent its request too slowly."""

    code = "request_timeout"


class TooManyRequests(LimitExceeded):
    """A limit on concurrent use (long-poll waiters) is reached: retry later."""

    code = "too_many_requests"


STATUS: dict[type[SchedulerError], int] = {
    InvalidRequest: 400,
    InvalidJob: 400,
    LimitExceeded: 400,
    TooLarge: 413,
    NotFound: 404,
    Conflict: 409,
    StaleFence: 409,
    Unavailable: 503,
    OutcomeUnknown: 503,
    Elsewhere: 503,
    Unauthorized: 401,
    Forbidden: 403,
    CrossSiteRefused: 403,
    MisdirectedHost: 421,
    UnsupportedMediaType: 415,
    TooManyRequests: 429,
    SlowRequest: 408,
    SchedulerError: 500,
}

# A client retries an Elsewhere as it would any Unavailable.
BY_CODE: dict[str, type[SchedulerError]] = {cls.code: Unavailable if cls is Elsewhere else cls for cls in STATUS}


def status_of(error: SchedulerError) -> int:
    return STATUS[type(error)] if type(error) in STATUS else 500


def from_wire(code: str, message: str) -> SchedulerError:
    """Rebuild the typed error a server sent as `{"error": {"code", "message"}}`."""
    return BY_CODE.get(code, SchedulerError)(message)
