"""Pieces shared by every rockbot resource: naming, conditions, Secret references, the CRD metadata."""

from __future__ import annotations

import datetime
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, GetCoreSchemaHandler, GetJsonSchemaHandler, model_validator
from pydantic.alias_generators import to_camel
from pydantic_core import core_schema

GROUP = "rockbot.dev"
VERSION = "v1alpha1"
CATEGORY = "rockbot"

#: A Kubernetes object name (RFC 1123 DNS label).
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
#: The OpenAI function-name rule, which every tool name must satisfy.
FUNCTION_NAME = r"^[a-zA-Z0-9_-]{1,64}$"
#: A Kubernetes resource quantity such as `500m`, `1`, `256Mi`, `1e3`: the grammar of
#: `resource.Quantity` (k8s.io/apimachinery), as controller-gen writes it into CRDs.
QUANTITY = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)

KubeName = Annotated[str, Field(pattern=DNS_LABEL, min_length=1, max_length=63)]
#: `maxLength` besides the pattern: CEL rules over these strings need a bound for their cost estimate.
FunctionName = Annotated[str, Field(pattern=FUNCTION_NAME, min_length=1, max_length=64)]
Quantity = Annotated[str, Field(pattern=QUANTITY)]


#: The longest a tool call may wait for a person's decision (a day).
MAX_APPROVAL_SECONDS = 86_400
OnApprovalTimeout = Literal["Deny", "Allow"]


@dataclass(frozen=True)
class Rule:
    """One validation rule, declared once in its two forms: `cel` is what the CRD gives the API server,
    `holds` the same test on the model, for where no API server checks (`rockbot local`). A test runs
    both over the same manifests (tests/core/test_validation_rules.py)."""

    cel: str
    message: str
    holds: Callable[[Any], bool]


class ListSet:
    """Marks a list the API server keeps free of duplicates (`x-kubernetes-list-type: set`), and refuses
    duplicates in Python too: `Annotated[list[str], ListSet()]`."""

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(_unique, handler(source))

    def __get_pydantic_json_schema__(
        self, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> dict[str, Any]:
        return {**handler(schema), "x-kubernetes-list-type": "set"}


def _unique(values: list[Any]) -> list[Any]:
    repeated = sorted({value for value in values if values.count(value) > 1})
    if repeated:
        raise ValueError(f"duplicate value {', '.join(map(repr, repeated))}: list each item once")
    return values


class Schema(BaseModel):
    """Base of every resource schema: camelCase on the wire, snake_case in Python, nothing unknown.

    A subclass lists its `rules`; they become the schema node's `x-kubernetes-validations` and are checked
    on validation, so the CRD and local runs refuse the same objects with the same message."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")
    rules: ClassVar[tuple[Rule, ...]] = ()

    def to_wire(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")

    @model_validator(mode="after")
    def _rules_hold(self) -> Self:
        broken = [rule.message for rule in self.rules if not rule.holds(self)]
        if broken:
            raise ValueError("; ".join(broken))
        return self

    @classmethod
    def __get_pydantic_json_schema__(
        cls, schema: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> dict[str, Any]:
        generated = handler(schema)
        if cls.rules:
            handler.resolve_ref_schema(generated)["x-kubernetes-validations"] = [
                {"rule": rule.cel, "message": rule.message} for rule in cls.rules
            ]
        return generated


def matches(pattern: str, text: str | None) -> bool:
    """CEL's `matches()` (an RE2 search) in Python; an absent string matches nothing."""
    return text is not None and re.search(pattern, text) is not None


def exactly_one(*values: Any) -> bool:
    return sum(value is not None for value in values) == 1


class SecretKeyRef(Schema):
    """A key of a Secret in the same namespace: secrets are referenced, never written inline."""

    name: KubeName = Field(description="Name of the Secret, in the resource's own namespace.")
    key: Annotated[str, Field(min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$")] = Field(
        description="Key of the Secret whose value is used."
    )


class Condition(Schema):
    """A status condition as Kubernetes API conventions define it."""

    type: Annotated[str, Field(pattern=r"^[A-Z][A-Za-z0-9]*$", max_length=316)]
    status: Literal["True", "False", "Unknown"]
    reason: Annotated[str, Field(pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$", max_length=1024)]
    message: Annotated[str, Field(max_length=32768)] = ""
    last_transition_time: datetime.datetime
    observed_generation: Annotated[int, Field(ge=0)] | None = None


class LocalObjectReference(Schema):
    name: KubeName = Field(description="Name of the object, in the same namespace.")


class PrinterColumn(BaseModel):
    name: str
    type: Literal["string", "integer", "number", "boolean", "date"]
    json_path: str = Field(serialization_alias="jsonPath")
    description: str = ""
    priority: int = 0


class Resource(Schema):
    """A custom resource kind: subclasses declare the CRD's names and printer columns.

    The object level ignores what the API server adds (`kind`, managed fields); `spec` stays strict.
    """

    model_config = ConfigDict(**Schema.model_config | {"extra": "ignore"})

    kind: ClassVar[str]
    plural: ClassVar[str]
    short_names: ClassVar[list[str]]
    printer_columns: ClassVar[list[PrinterColumn]]
    # Its `rules` see the whole object: the only place where `metadata.name` is visible.
