"""Request errors that map one-to-one onto gRPC status codes.

Core logic (tables, decoders) raises these without knowing about gRPC; the serving
layer turns them into the status code and message. Every message names the field.
"""

import grpc


class RequestError(Exception):
    """A request the server refuses; nothing was changed."""

    code = grpc.StatusCode.INVALID_ARGUMENT

    # Status messages travel as HTTP/2 trailers (16 KiB at most): values echoed from a
    # request (table or column names) are cut so the status itself always gets through.
    MAX_MESSAGE = 1024

    def __init__(self, field: str, message: str):
        text = f"{field}: {message}"
        if len(text) > self.MAX_MESSAGE:
            text = text[: self.MAX_MESSAGE - 20] + f"... ({len(text)} chars)"
        super().__init__(text)
        self.field = field


class InvalidArgument(RequestError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(RequestError):
    code = grpc.StatusCode.NOT_FOUND


class FailedPrecondition(RequestError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class ResourceExhausted(RequestError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class Internal(RequestError):
    code = grpc.StatusCode.INTERNAL
