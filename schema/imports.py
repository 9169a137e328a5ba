"""The JSON Lines import format (DESIGN section 4): one session per line."""

from __future__ import annotations

from typing import Any

from marshmallow import INCLUDE, RAISE, Schema, ValidationError, fields, validate, validates

from schema.common import Slug, StrictInteger

SESSION_STATUSES = ("active", "completed", "abandoned", "error")


class MessageSchema(Schema):
    """One chat message, kept verbatim: extra keys (name, tool_calls, ...) pass through."""

    class Meta:
        unknown = INCLUDE

    role = fields.String(required=True)
    content = fields.Raw(required=True, allow_none=True)

    @validates("role")
    def _role(self, value: str, **_: Any) -> None:
        if not value.strip():
            raise ValidationError("must not be empty.")

    @validates("content")
    def _content(self, value: Any, **_: Any) -> None:
        if value is not None and not isinstance(value, str | list):
            raise ValidationError("must be a string, a list of content parts, or null.")


class TurnSchema(Schema):
    class Meta:
        unknown = RAISE

    messages = fields.List(
        fields.Nested(MessageSchema), required=True, validate=validate.Length(min=1)
    )
    completion = fields.Nested(MessageSchema, required=True)
    prompt_tokens = StrictInteger(load_default=0, validate=validate.Range(min=0))
    completion_tokens = StrictInteger(load_default=0, validate=validate.Range(min=0))
    latency_ms = StrictInteger(load_default=0, validate=validate.Range(min=0))
    is_streaming = fields.Boolean(load_default=False, truthy={True}, falsy={False})


class SessionLineSchema(Schema):
    class Meta:
        unknown = RAISE

    org = Slug(required=True)
    agent = Slug(required=True)
    session = fields.String(required=True, validate=validate.Length(min=1, max=255))
    status = fields.String(load_default="completed", validate=validate.OneOf(SESSION_STATUSES))
    model = fields.String(load_default=None, allow_none=True, validate=validate.Length(max=200))
    provider = fields.String(load_default=None, allow_none=True, validate=validate.Length(max=200))
    turns = fields.List(fields.Nested(TurnSchema), required=True)
