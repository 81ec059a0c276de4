"""Errors as OpenAI clients expect them: an HTTP status and `{"error": {message, type, param,
code}}`.

Malformed JSON and values out of range (pydantic's validation) are 400
`invalid_request_error` naming the offending field in `param`; an unknown model is 404
`model_not_found`; a prompt or prompt + max_tokens past the context is 400
`context_length_exceeded`; a missing or wrong API key is 401 `invalid_api_key`; a server
whose engine loop has stopped answers 503. The official clients turn these into their
`BadRequestError`, `NotFoundError`, `AuthenticationError` and so on.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

INVALID = "invalid_request_error"


class APIError(Exception):
    """A request the server refuses: the status and the body fields."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        kind: str = INVALID,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.kind = kind

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        }


def from_validation(error: RequestValidationError) -> APIError:
    """The first problem pydantic found, as one 400 naming its field."""
    problems = error.errors()
    if not problems:
        return APIError(400, "invalid request body")
    first = problems[0]
    location = [str(part) for part in first.get("loc", ()) if part != "body"]
    if first.get("type") == "json_invalid":
        return APIError(400, f"the body is not valid JSON: {first.get('msg')}", code="json_invalid")
    param = ".".join(location) or None
    message = f"{param}: {first.get('msg')}" if param else str(first.get("msg"))
    return APIError(400, message, param=location[0] if location else None)


def install(app: FastAPI) -> None:
    """Answer every refusal and validation failure with the OpenAI error body."""

    async def api_error(request: Request, error: Exception) -> JSONResponse:
        del request
        assert isinstance(error, APIError)
        return JSONResponse(error.body(), status_code=error.status)

    async def validation_error(request: Request, error: Exception) -> JSONResponse:
        del request
        assert isinstance(error, RequestValidationError)
        refused = from_validation(error)
        return JSONResponse(refused.body(), status_code=refused.status)

    app.add_exception_handler(APIError, api_error)
    app.add_exception_handler(RequestValidationError, validation_error)
