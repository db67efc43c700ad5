"""Pieces shared by every rockbot resource: naming, conditions, Secret references, the CRD metadata."""

from __future__ import annotations

import datetime
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

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


class Schema(BaseModel):
    """Base of every resource schema: camelCase on the wire, snake_case in Python, nothing unknown."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    def to_wire(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


class SecretKeyRef(Schema):
    """A key of a Secret in the same namespace: secrets are referenced, never written inline."""

    name: KubeName
    key: Annotated[str, Field(min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$")]


class Condition(Schema):
    """A status condition as Kubernetes API conventions define it."""

    type: Annotated[str, Field(pattern=r"^[A-Z][A-Za-z0-9]*$", max_length=316)]
    status: Literal["True", "False", "Unknown"]
    reason: Annotated[str, Field(pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$", max_length=1024)]
    message: Annotated[str, Field(max_length=32768)] = ""
    last_transition_time: datetime.datetime
    observed_generation: Annotated[int, Field(ge=0)] | None = None


class LocalObjectReference(Schema):
    name: KubeName


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
    #: CEL rules on the whole object (the only place where `metadata.name` is visible).
    object_rules: ClassVar[list[dict[str, str]]] = []


def cel_rules(*rules: tuple[str, str]) -> ConfigDict:
    """Model config adding CEL `x-kubernetes-validations` (rule, message) to the model's schema."""
    validations = [{"rule": rule, "message": message} for rule, message in rules]
    return ConfigDict(**Schema.model_config, json_schema_extra={"x-kubernetes-validations": validations})
