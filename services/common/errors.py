"""Request errors that map one-to-one onto gRPC status codes.

Core logic (tables, decoders) raises these without knowing about gRPC; the serving
layer turns them into the status code and message. Every message names the field.
"""

import grpc


class RequestError(Exception):
    """A request the server refuses; nothing was changed."""

    code = grpc.StatusCode.INVALID_ARGUMENT

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


class InvalidArgument(RequestError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(RequestError):
    code = grpc.StatusCode.NOT_FOUND


class FailedPrecondition(RequestError):
    code = grpc.StatusCode.FAILED_PRECONDITION
