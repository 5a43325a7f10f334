"""atoll's one error root, its exit codes, and the validation errors of the contract layer.

Every exception atoll defines derives from ``AtollError`` (spec is the bottom layer, so every
layer may import it); each class keeps the stdlib base its callers catch (``KitError`` is an
``AtollError`` and a ``ValueError``) and carries the ``exit_code`` a command or parent exits
with when it ends on that error. The CLI prints every error through one renderer
(``atoll.cli.common.render_error``). The codes, in one table (``EXIT_CODES``; docs/cli.md
"Exit codes" is generated from it):

    code  name         meaning
    0     OK           success; a parent stopped cleanly; a worker's part of the job completed
    1     FAILED       an error with no more specific code; `atoll job submit --wait`: the job
                       did not complete; a worker: the workflow or training script failed (its
                       traceback is in the worker log)
    2     INVALID      invalid input or a refusal: a bad argument, kit, configuration, job
                       folder or document (every problem is listed), a request the server or
                       a site refused; a worker: started without its environment
    3     CONNECTION   no connection: the server cannot be reached (is it running? is the
                       kit's address right?); a parent: its port could not be opened or it did
                       not start detached; a worker: its parent refused its registration
    4     AUTH         certificate or session refused: run `atoll login`
    5     NOT_FOUND    no such job (also for another study's job)
    70    PARENT_DIED  a worker: its parent died, so it stopped
    130   INTERRUPTED  interrupted (Ctrl-C)

The tree, drawn once: every class atoll defines, under the exit code it ends a command or
parent with, and what to do then (a subclass in brackets after its base; each also keeps the
stdlib base its callers catch; tests/unit/spec/test_error_root.py checks the drawing):

    AtollError
    ├── 1 FAILED: the job's own code or a protocol step failed; its log says why
    │   AggregateCorrupted, BudgetExhausted, CheckpointHomeError, CheckTimeout, ClientError,
    │   CredentialError, CredentialNotIssued, EncodingError, LedgerRefused, PeerNotAuthenticated,
    │   PrivacyRefused, RankError, ResultRejected, SecAggRefused, ShareDecryptError,
    │   SiteScriptError, StatisticsError, StatisticsRefused, StoreFailed, TrackingError,
    │   WorkflowError
    ├── 2 INVALID: change the input or request the message names, then retry
    │   AppConfigError, ApprovalsError, BackendError, BackupError, BadMessage, BodyError,
    │   CAError, CheckpointDamaged, ControlTooLarge, CredentialsTooLarge, CRLError, DecodeError,
    │   Denied[NoSuchStudy], FrameError[HandoffError], IdentifierError, IdentityError,
    │   IntakeError, IssuesError, JobFileError, JobRefused, KitError, LaunchError,
    │   NotAdmitted, NotTrusted, ProvenanceError, ProvisionError, QuantizedPayloadError,
    │   Refused, RelayError,
    │   Replayed,
    │   SandboxUnavailable, SerdeError, SignatureError, SimulationError,
    │   SpecError[ProjectError], Unvouched, UnvouchedMeta
    ├── 3 CONNECTION: check the peer runs and is reachable, then retry
    │   ConnectionFailed, ParentGone, RegistryError, SpoolError, Stalled
    ├── 4 AUTH: run `atoll login`, or renew the certificate
    │   AuthError, PeerRefused
    └── 5 NOT_FOUND: check the job id and the study
        NoSuchJob, NotFound, NotRunning

Validation errors of the contract layer: every problem of a document, each with its path.

``SpecError`` is the one exception the spec loaders raise. It carries every ``Issue`` found in a
document (a file's errors are reported together, never one at a time), each naming the path of
the offending value (``studies.pathology.datasets.slides.mode``) and what to change.

Pydantic's own errors are translated at one boundary, ``issues_from_validation_error``: readable
paths, plain sentences, no pydantic URLs. Validators that find several problems at once raise
``IssuesError`` (a ``ValueError``, so pydantic collects it with its sibling errors); the
translation expands it back into one Issue per problem under the validator's location.

Only that translation needs pydantic, and imports it when called: parents and the CLI import
``SpecError`` at rest, and pydantic alone adds ~10 MiB to a process.
"""

from __future__ import annotations

import re
import types
import typing
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pydantic import BaseModel, ValidationError

_INTERNAL_LOC = re.compile(r"[a-z][a-z-]*\[.*\]")
MAX_SHOWN = 20  # issues a message lists; the rest are counted


@dataclass(frozen=True)
class Issue:
    """One problem: where (a dotted path into the document) and what to change."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


# code, name, meaning: the one table of exit codes (the module docstring shows it).
EXIT_CODES: tuple[tuple[int, str, str], ...] = (
    (0, "OK", "success; a parent stopped cleanly; a worker's part of the job completed"),
    (1, "FAILED", "an error with no more specific code; `atoll job submit --wait`: the job did "
     "not complete; a worker: the workflow or training script failed (its traceback is in "
     "the worker log)"),
    (2, "INVALID", "invalid input or a refusal: a bad argument, kit, configuration, job folder "
     "or document (every problem is listed), a request the server or a site refused; a "
     "worker: started without its environment"),
    (3, "CONNECTION", "no connection: the server cannot be reached (is it running? is the "
     "kit's address right?); a parent: its port could not be opened or it did not start "
     "detached; a worker: its parent refused its registration"),
    (4, "AUTH", "certificate or session refused: run `atoll login`"),
    (5, "NOT_FOUND", "no such job (also for another study's job)"),
    (70, "PARENT_DIED", "a worker: its parent died, so it stopped"),
    (130, "INTERRUPTED", "interrupted (Ctrl-C)"),
)
EXIT_OK, EXIT_FAILED, EXIT_INVALID, EXIT_CONNECTION = 0, 1, 2, 3
EXIT_AUTH, EXIT_NOT_FOUND, EXIT_PARENT_DIED, EXIT_INTERRUPTED = 4, 5, 70, 130


class AtollError(Exception):
    """The root of every error atoll raises; the message says what happened and what to do.

    ``exit_code`` (one of ``EXIT_CODES``) is what a command or parent exits with on it."""

    exit_code: int = EXIT_FAILED


class SpecError(AtollError):
    """A document is invalid; ``issues`` lists every problem found, ``source`` names the file."""

    exit_code = EXIT_INVALID

    def __init__(self, issues: Iterable[Issue], source: str | None = None) -> None:
        self.issues: list[Issue] = list(issues)
        self.source = source
        super().__init__(str(self))

    def __reduce__(self):
        # Rebuilt from its issues (not its text) when it crosses a process boundary.
        return (type(self), (self.issues, self.source))

    def __str__(self) -> str:
        lines = [str(issue) for issue in self.issues[:MAX_SHOWN]]
        if len(self.issues) > MAX_SHOWN:  # a generated document can hold thousands
            lines.append(f"... and {len(self.issues) - MAX_SHOWN:,} more problems")
        if self.source:
            count = len(self.issues)
            head = f"{self.source}: {count} problem{'s' if count != 1 else ''}"
            return "\n".join([head, *("  " + line for line in lines)])
        return "\n".join(lines)


class IssuesError(AtollError, ValueError):
    """Raised inside a pydantic validator to report several problems under its location."""

    exit_code = EXIT_INVALID

    def __init__(self, issues: Sequence[Issue]) -> None:
        self.issues = list(issues)
        super().__init__("; ".join(str(i) for i in self.issues))


def join_path(*parts: str | int) -> str:
    """``join_path("deploy_map", "app", 0)`` -> ``deploy_map.app[0]``; empty parts are skipped."""
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part.startswith("["):
            out += part
        elif part:
            out = f"{out}.{part}" if out else part
    return out


def prefixed(prefix: str, issues: Iterable[Issue]) -> list[Issue]:
    return [Issue(join_path(prefix, i.path), i.message) for i in issues]


def describe(value: Any) -> str:
    """A short, safe rendering of a user value for messages (never long, never multi-line)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def kind_of(value: Any) -> str:
    """The kind of a value, never the value itself (it may be a secret put in the wrong place)."""
    if value is None or isinstance(value, bool | dict | list | tuple):
        return describe(value)
    if isinstance(value, str):
        return "a string"
    if isinstance(value, int | float):
        return "a number"
    return type(value).__name__


def issues_from_validation_error(
    error: ValidationError, model: type[BaseModel] | None = None, prefix: str = ""
) -> list[Issue]:
    """Translate pydantic's errors into Issues; ``model`` lets unknown-key errors list the
    allowed keys."""
    issues: list[Issue] = []
    for err in error.errors(include_url=False):
        # An empty key is shown as "" so that the path still points at it.
        loc = [p if p != "" else '""' for p in err["loc"] if not _is_internal_loc(p)]
        ctx = err.get("ctx") or {}
        inner = ctx.get("error")
        if isinstance(inner, IssuesError):
            base = join_path(prefix, *loc)
            issues.extend(Issue(join_path(base, i.path), i.message) for i in inner.issues)
            continue
        issues.append(Issue(join_path(prefix, *loc), _message(err, loc, model)))
    return issues


def _is_internal_loc(part: str | int) -> bool:
    # Validator wrappers and dict-key markers in pydantic locations: "function-after[...]", "[key]".
    return isinstance(part, str) and (part == "[key]" or _INTERNAL_LOC.fullmatch(part) is not None)


def _message(err: Any, loc: list[str | int], model: type[BaseModel] | None) -> str:
    kind = err["type"]
    value = err.get("input")
    ctx = err.get("ctx") or {}
    if kind == "extra_forbidden":
        allowed = _allowed_keys(model, loc[:-1]) if model is not None else None
        hint = f"; allowed keys: {', '.join(allowed)}" if allowed else ""
        return f"unknown key{hint}"
    if kind == "missing":
        return "required key is missing; add it"
    if kind == "value_error":
        return str(err["msg"]).removeprefix("Value error, ")
    if kind in {"int_type", "int_parsing", "int_from_float"}:
        return f"must be an integer, not {describe(value)}"
    if kind in {"string_type", "string_unicode"}:
        return f"must be a string, not {describe(value)}"
    if kind in {"bool_type", "bool_parsing"}:
        return f"must be true or false, not {describe(value)}"
    if kind in {"dict_type", "model_type", "model_attributes_type"}:
        return f"must be a mapping, not {kind_of(value)}"
    if kind in {"list_type", "tuple_type"}:
        return f"must be a list, not {kind_of(value)}"
    if kind == "literal_error":
        return f"must be one of {ctx.get('expected', '')}, not {describe(value)}"
    if kind == "greater_than_equal":
        return f"must be at least {ctx.get('ge')}, not {describe(value)}"
    if kind == "greater_than":
        return f"must be greater than {ctx.get('gt')}, not {describe(value)}"
    if kind == "less_than_equal":
        return f"must be at most {ctx.get('le')}, not {describe(value)}"
    if kind == "string_too_short":
        return "must not be empty"
    if kind == "string_too_long":
        return f"must be at most {ctx.get('max_length')} characters"
    if kind == "string_pattern_mismatch":
        return f"{describe(value)} does not match the pattern {ctx.get('pattern')}"
    return str(err["msg"]).replace("Input should be", "must be")


def _allowed_keys(model: type[BaseModel] | None, loc: list[str | int]) -> list[str] | None:
    """Walk ``model``'s annotations along ``loc`` to the mapping that rejected a key."""
    from pydantic import BaseModel, RootModel

    current: Any = model
    for part in loc:
        current = _unwrap(current)
        if isinstance(current, type) and issubclass(current, RootModel):
            current = _unwrap(current.model_fields["root"].annotation)
        if isinstance(current, type) and issubclass(current, BaseModel):
            field = current.model_fields.get(str(part))
            if field is None:
                return None
            current = field.annotation
        elif typing.get_origin(current) in (dict, list):
            current = typing.get_args(current)[-1]
        else:
            return None
    current = _unwrap(current)
    if isinstance(current, type) and issubclass(current, BaseModel):
        return [f.alias or name for name, f in current.model_fields.items()]
    return None


def _unwrap(annotation: Any) -> Any:
    """Strip Optional[...] and Annotated[...] to the model or container type."""
    from pydantic import BaseModel

    while True:
        origin = typing.get_origin(annotation)
        if origin is typing.Annotated:
            annotation = typing.get_args(annotation)[0]
        elif origin in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(annotation) if a is not type(None)]
            models = [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]
            annotation = models[0] if models else args[0]
        else:
            return annotation
