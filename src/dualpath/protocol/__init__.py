"""The OpenAI-compatible protocol: request models, response builders, errors, streamed text.

Independent of the runtime (pydantic only), so any front end (the scheduler's HTTP API, a router in front of
other engines) validates and answers requests the same way.
"""

from dualpath.protocol.errors import ProtocolError, error_body, validation_error
from dualpath.protocol.requests import (
    ChatCompletionBody,
    ChatMessage,
    CompletionBody,
    DetokenizeBody,
    SamplingBody,
    StreamOptions,
    TokenizeBody,
)
from dualpath.protocol.text import IncrementalDetokenizer, StopStringMatcher

__all__ = [
    "ChatCompletionBody",
    "ChatMessage",
    "CompletionBody",
    "DetokenizeBody",
    "IncrementalDetokenizer",
    "ProtocolError",
    "SamplingBody",
    "StopStringMatcher",
    "StreamOptions",
    "TokenizeBody",
    "error_body",
    "validation_error",
]
