"""One-line error messages that name the offending field (for the CLI, the Triton models and HTTP fronts)."""

from __future__ import annotations

import re


class FieldError(ValueError):
    """A bad value: ``field`` (a path such as ``gamma`` or ``messages[1].role``) and ``message``; ``str()`` reads
    ``"field: message"``. Fronts name the field in their own terms
    (:func:`lookahead_reasoning.core.request.front_error`)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.field, self.message = field, message


#: Union-member tags pydantic puts in an error's location (``("prompt", "list[int]", 0)``): not field names.
_TYPE_TAG = re.compile(r"^(str|int|float|bool|list|dict|none|[\w-]+\[.*\])$")


def is_type_tag(part) -> bool:
    """Whether a location part is a union-member tag (``str``, ``list[int]``, ``function-after[...]``)."""
    return isinstance(part, str) and bool(_TYPE_TAG.match(part))


def field_path(loc) -> str:
    """A pydantic error location as a path: ``("messages", 1, "role")`` -> ``"messages[1].role"``; union-member
    tags are left out (``("prompt", "str")`` -> ``"prompt"``)."""
    out = ""
    for part in loc:
        if is_type_tag(part):
            continue
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def from_validation(exc, field_of=field_path) -> FieldError:
    """The first error of a pydantic ``ValidationError`` as a :class:`FieldError` (``field_of`` maps its
    location to a field; a model-level validator's ``"field: ..."`` message names the field itself)."""
    first = exc.errors()[0]
    msg = str(first.get("msg", exc)).replace("Value error, ", "")
    field = field_of(tuple(first.get("loc", ())))
    if not field and ":" in msg:
        head, rest = msg.split(":", 1)
        if head.isidentifier():
            field, msg = head, rest.strip()
    return FieldError(field, msg)


def describe(exc: BaseException) -> tuple[str, str]:
    """``(field, message)`` for an exception; pydantic validation errors name the field through their location,
    our own ``ValueError``s start with ``"field: "``. ``field`` is "" when unknown."""
    if callable(getattr(exc, "errors", None)):
        try:  # the full dotted path, e.g. "judge.name" (list indices left out)
            err = from_validation(exc, lambda loc: ".".join(str(x) for x in loc if not str(x).isdigit()))
            return err.field, err.message
        except Exception:  # noqa: BLE001 - fall through to the plain message
            pass
    text = str(exc).strip()
    line = text.splitlines()[0] if text else type(exc).__name__
    head, sep, rest = line.partition(":")
    if sep and head.replace("_", "").replace(".", "").isalnum() and " " not in head:
        return head, rest.strip()
    return "", line


def one_line(exc: BaseException) -> str:
    """``"field: message"`` (or just the message)."""
    field, msg = describe(exc)
    return f"{field}: {msg}" if field else msg
