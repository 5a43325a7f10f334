"""The base of every contract model, and one way to validate a document into Issues."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from atoll.spec.errors import Issue, issues_from_validation_error

M = TypeVar("M", bound=BaseModel)


class SpecModel(BaseModel):
    """Strict: unknown keys are errors, no silent type coercion (``"4"`` is not 4, true is not 1)."""

    model_config = ConfigDict(extra="forbid", strict=True, validate_default=False)


def validate_into(
    model: type[M], data: Any, prefix: str = "", context: dict[str, Any] | None = None
) -> tuple[M | None, list[Issue]]:
    """Validate ``data`` as ``model``; returns the instance or every Issue (paths under prefix)."""
    try:
        return model.model_validate(data, context=context), []
    except ValidationError as err:
        return None, issues_from_validation_error(err, model, prefix)


NULL_HINT = "null is not allowed; remove the key to use the default"


class NoNullModel(SpecModel):
    """A model whose optional keys may be left out but never written as ``null``."""

    null_hint: ClassVar[str] = NULL_HINT  # what the error says to write instead

    @field_validator("*", mode="before")
    @classmethod
    def _no_null(cls, value: Any) -> Any:
        if value is None:
            raise ValueError(cls.null_hint)
        return value


def check_fields(check: Callable[[Any], Any], *fields: str) -> Any:
    """A reusable field validator: ``_mem = check_fields(check_memory, "memory")``."""
    return field_validator(*fields)(lambda cls, value: check(value))
