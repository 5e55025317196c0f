"""The gateway's exception tree; the HTTP edge maps each class to an OpenAI-shaped error body.

    GatewayError
    ├── ConfigError                  bad or missing configuration (raised at start-up)
    ├── ClientError                  the request itself is wrong (4xx)
    │   ├── InvalidRequest           400: malformed JSON, missing or invalid fields
    │   ├── AuthenticationFailed     401: unknown or missing gateway key
    │   ├── NotFound                 404: no such route or resource
    │   ├── PayloadTooLarge          413: body over `server.max_body_bytes`
    │   ├── RateLimited              429: the tenant is over `limits.requests_per_minute`
    │   └── NotSupported             501: the tenant's provider cannot serve this endpoint
    ├── StoreError                   the database failed (the request path fails open around it)
    │   └── SearchIndexError         the vector / full-text index (LanceDB) failed
    ├── EmbeddingError               the embedder failed (local model or a provider's /v1/embeddings)
    └── UpstreamError                the provider could not be reached or failed (5xx)
        ├── UpstreamUnreachable      502: connection refused, DNS, TLS, protocol errors
        └── UpstreamTimeout          504: connect or read timed out

Adapters translate foreign exceptions at their boundary (`raise UpstreamTimeout(...) from exc`) so the
rest of the code only ever sees these.
"""

from __future__ import annotations


class GatewayError(Exception):
    """Base class. `status`, `error_type` and `code` feed the OpenAI-shaped error body."""

    status: int = 500
    error_type: str = "server_error"
    code: str | None = None

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code


class ConfigError(GatewayError):
    """The configuration is invalid; the message names the key and the problem."""


class ClientError(GatewayError):
    status = 400
    error_type = "invalid_request_error"


class InvalidRequest(ClientError):
    status = 400


class AuthenticationFailed(ClientError):
    status = 401
    code = "invalid_api_key"


class NotFound(ClientError):
    status = 404
    code = "not_found"


class PayloadTooLarge(ClientError):
    status = 413
    code = "payload_too_large"


class RateLimited(ClientError):
    status = 429
    error_type = "requests"  # OpenAI's type for a request-rate 429
    code = "rate_limit_exceeded"

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class NotSupported(ClientError):
    status = 501
    code = "not_supported"


class StoreError(GatewayError):
    status = 503
    code = "store_unavailable"


class ConversationDeleted(StoreError):
    """The conversation was deleted while a request was writing to it (an answer still streaming when
    the DELETE landed, or another replica's cache naming a deleted conversation): nothing was written."""

    code = "conversation_deleted"


class SearchIndexError(StoreError):
    code = "index_unavailable"


class EmbeddingError(GatewayError):
    status = 503
    code = "embedding_failed"


class UpstreamError(GatewayError):
    status = 502
    error_type = "upstream_error"


class UpstreamUnreachable(UpstreamError):
    status = 502
    code = "upstream_unreachable"


class UpstreamTimeout(UpstreamError):
    status = 504
    code = "upstream_timeout"
