"""Which resources the emulated API serves: the built-in kinds, plus those CRDs declare."""

import copy
import functools
import warnings
from dataclasses import dataclass, field
from typing import Any

import kmock

# Built-in resources whose objects carry `metadata.generation` (their strategies set it);
# ConfigMaps, Secrets, Services, ServiceAccounts and Namespaces have none on a real server.
GENERATION_TRACKED = {
    ("apps", "deployments"),
    ("apps", "statefulsets"),
    ("apps", "daemonsets"),
    ("apps", "replicasets"),
    ("batch", "jobs"),
    ("batch", "cronjobs"),
    ("networking.k8s.io", "networkpolicies"),
    ("networking.k8s.io", "ingresses"),
    ("policy", "poddisruptionbudgets"),
    ("apiextensions.k8s.io", "customresourcedefinitions"),
    ("", "pods"),
}

ALL_VERBS = {"create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"}


@dataclass(kw_only=True)
class ResourceType:
    """One served resource: its names, scope, subresources, and (for custom resources) schemas per version."""

    group: str
    versions: list[str]
    plural: str
    kind: str
    singular: str
    namespaced: bool
    subresources: set[str] = field(default_factory=set)
    short_names: set[str] = field(default_factory=set)
    categories: set[str] = field(default_factory=set)
    verbs: set[str] = field(default_factory=lambda: set(ALL_VERBS))
    custom: bool = False
    # Custom resources: the schema (already compiled for validation) per served version.
    schemas: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> tuple[str, str]:
        return (self.group, self.plural)

    @property
    def has_status(self) -> bool:
        return "status" in self.subresources

    @property
    def tracks_generation(self) -> bool:
        return self.custom or self.key in GENERATION_TRACKED

    def api_version(self, version: str) -> str:
        return f"{self.group}/{version}" if self.group else version

    def info(self) -> kmock.ResourceInfo:
        """The discovery entry (served by kmock's scaffold)."""
        return kmock.ResourceInfo(
            namespaced=self.namespaced,
            kind=self.kind,
            singular=self.singular,
            verbs=set(self.verbs),
            shortnames=set(self.short_names),
            categories=set(self.categories),
            subresources=set(self.subresources),
        )


class Registry:
    """Resource types by (group, version, plural), kept in step with kmock's discovery array."""

    def __init__(self, *, discovery: kmock.ResourcesArray) -> None:
        self._discovery = discovery
        self._types: dict[tuple[str, str], ResourceType] = {}
        for ref, info in _bundled().items():
            assert isinstance(info, kmock.ResourceInfo)
            info = copy.deepcopy(info)
            key = (ref.group, ref.plural)
            if key in self._types:
                self._types[key].versions.append(ref.version)
            else:
                self._types[key] = ResourceType(
                    group=ref.group,
                    versions=[ref.version],
                    plural=ref.plural,
                    kind=info.kind or ref.plural,
                    singular=info.singular or ref.plural,
                    namespaced=bool(info.namespaced),
                    subresources=set(info.subresources),
                    short_names=set(info.shortnames),
                    categories=set(info.categories),
                    verbs=set(info.verbs),
                )
            discovery[ref] = info

    def find(self, *, group: str, version: str, plural: str) -> ResourceType | None:
        rtype = self._types.get((group, plural))
        return rtype if rtype is not None and version in rtype.versions else None

    def get(self, key: tuple[str, str]) -> ResourceType | None:
        return self._types.get(key)

    def add(self, rtype: ResourceType) -> None:
        """Serve a custom resource (replacing an older definition of it)."""
        self.remove(rtype.key)
        self._types[rtype.key] = rtype
        for version in rtype.versions:
            self._discovery[kmock.resource(rtype.group, version, rtype.plural)] = rtype.info()

    def remove(self, key: tuple[str, str]) -> None:
        old = self._types.pop(key, None)
        if old is not None:
            for version in old.versions:
                del self._discovery[kmock.resource(old.group, version, old.plural)]


@functools.cache
def _bundled() -> kmock.ResourcesArray:
    """kmock's bundled built-in resources (a recent K3s cluster's discovery), loaded once."""
    bundled = kmock.ResourcesArray()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # kmock uses importlib.resources.read_binary
        bundled.load_bundled()
    return bundled
