"""Per-type Unified Memory policies: dataclasses, presets, YAML files and their validation.

A policy gives each type of training data (``params``, ``activations``, ``inputs``) a
preferred location, an accessed-by set, the read-mostly hint and a prefetch mode, plus the
order in which types get a GPU budget. Presets live in ``hpcmem/um/presets/*.yaml``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from hpcmem.errors import HpcmemError
from hpcmem.textfiles import TextFileError, load_yaml, read_text

__all__ = [
    "ALLOCATORS",
    "LOCATIONS",
    "PREFETCH_MODES",
    "PRESETS",
    "TYPES",
    "Policy",
    "PolicyError",
    "TypePolicy",
    "load_policy",
    "policy_from_dict",
]

TYPES = ("params", "activations", "inputs")
LOCATIONS = ("gpu", "cpu", "none")
ACCESSORS = ("gpu", "cpu")
PREFETCH_MODES = ("none", "on_alloc", "before_use")
#: activations are made and used inside one step: nothing to prefetch before use
ACTIVATION_PREFETCH_MODES = ("none", "on_alloc")
ALLOCATORS = ("managed", "cuda")
TYPE_FIELDS = ("preferred_location", "accessed_by", "read_mostly", "prefetch")
POLICY_FIELDS = ("name", "allocator", "priority", *TYPES)


class PolicyError(HpcmemError, ValueError):
    """A policy field with a value that is not accepted; the message names field and value."""


def _not_one_of(where: str, value: Any, accepted: tuple[str, ...]) -> PolicyError:
    return PolicyError(f"{where}: {value!r} is not one of {', '.join(accepted)}")


@dataclass(frozen=True)
class TypePolicy:
    """Advice and prefetch for one type of data; each new segment of the type gets it."""

    preferred_location: str = "none"
    accessed_by: tuple[str, ...] = ()
    read_mostly: bool = False
    prefetch: str = "none"

    def wants_gpu(self) -> bool:
        """Whether this type's segments are placed on the GPU (and so count in a budget)."""
        return self.preferred_location == "gpu" or (
            self.preferred_location == "none" and self.prefetch == "on_alloc"
        )

    def has_advice(self) -> bool:
        """Whether any advice or prefetch is asked for."""
        return self != TypePolicy()


@dataclass(frozen=True)
class Policy:
    """A named per-type policy; ``allocator="cuda"`` means PyTorch's allocator, no UM."""

    name: str
    params: TypePolicy = field(default_factory=TypePolicy)
    activations: TypePolicy = field(default_factory=TypePolicy)
    inputs: TypePolicy = field(default_factory=TypePolicy)
    priority: tuple[str, ...] = TYPES
    allocator: str = "managed"

    def __post_init__(self) -> None:
        _validate(self)

    @property
    def managed(self) -> bool:
        """Whether this policy allocates CUDA managed memory (everything but ``cuda``)."""
        return self.allocator == "managed"

    def type_policy(self, type_name: str) -> TypePolicy:
        """The policy of one type by name."""
        if type_name not in TYPES:
            raise _not_one_of("type", type_name, TYPES)
        return getattr(self, type_name)

    def to_record(self) -> dict[str, Any]:
        """Name plus the full per-type table, as stored in result records and YAML files."""
        record: dict[str, Any] = {
            "name": self.name,
            "allocator": self.allocator,
            "priority": list(self.priority),
        }
        for type_name in TYPES:
            table = asdict(self.type_policy(type_name))
            table["accessed_by"] = list(table["accessed_by"])
            record[type_name] = table
        return record

    def to_yaml(self) -> str:
        """The policy as a YAML document that :func:`load_policy` reads back unchanged."""
        import yaml

        return yaml.safe_dump(self.to_record(), sort_keys=False)


def _validate(policy: Policy) -> None:
    if not isinstance(policy.name, str) or not policy.name:
        raise PolicyError(f"policy.name: {policy.name!r} must be a non-empty string")
    if policy.allocator not in ALLOCATORS:
        raise _not_one_of("policy.allocator", policy.allocator, ALLOCATORS)
    if sorted(policy.priority) != sorted(TYPES):
        raise PolicyError(
            f"policy.priority: {list(policy.priority)!r} must list each of "
            f"{', '.join(TYPES)} exactly once"
        )
    for type_name in TYPES:
        _validate_type(f"policy.{type_name}", type_name, policy.type_policy(type_name))
        if not policy.managed and policy.type_policy(type_name).has_advice():
            raise PolicyError(
                f"policy.{type_name}: advice needs allocator: managed "
                "(allocator: cuda is PyTorch's own allocator and takes no advice)"
            )


def _validate_type(where: str, type_name: str, tp: TypePolicy) -> None:
    if tp.preferred_location not in LOCATIONS:
        raise _not_one_of(f"{where}.preferred_location", tp.preferred_location, LOCATIONS)
    if not isinstance(tp.accessed_by, tuple):
        raise PolicyError(f"{where}.accessed_by: {tp.accessed_by!r} must be a list of gpu, cpu")
    for accessor in tp.accessed_by:
        if accessor not in ACCESSORS:
            raise _not_one_of(f"{where}.accessed_by", accessor, ACCESSORS)
    if len(set(tp.accessed_by)) != len(tp.accessed_by):
        raise PolicyError(f"{where}.accessed_by: {list(tp.accessed_by)!r} lists a location twice")
    if not isinstance(tp.read_mostly, bool):
        raise _not_one_of(f"{where}.read_mostly", tp.read_mostly, ("true", "false"))
    modes = ACTIVATION_PREFETCH_MODES if type_name == "activations" else PREFETCH_MODES
    if tp.prefetch not in modes:
        raise _not_one_of(f"{where}.prefetch", tp.prefetch, modes)


def _type_from_dict(where: str, type_name: str, data: Any) -> TypePolicy:
    if not isinstance(data, Mapping):
        raise PolicyError(f"{where}: {data!r} must be a mapping of {', '.join(TYPE_FIELDS)}")
    unknown = [key for key in data if key not in TYPE_FIELDS]
    if unknown:
        raise _not_one_of(f"{where}: key", unknown[0], TYPE_FIELDS)
    accessed_by = data.get("accessed_by", [])
    if not isinstance(accessed_by, list | tuple):
        raise PolicyError(f"{where}.accessed_by: {accessed_by!r} must be a list of gpu, cpu")
    tp = TypePolicy(
        preferred_location=data.get("preferred_location", "none"),
        accessed_by=tuple(accessed_by),
        read_mostly=data.get("read_mostly", False),
        prefetch=data.get("prefetch", "none"),
    )
    _validate_type(where, type_name, tp)
    return tp


def policy_from_dict(data: Any, default_name: str | None = None) -> Policy:
    """Build and validate a :class:`Policy` from a mapping (a parsed YAML document)."""
    if not isinstance(data, Mapping):
        raise PolicyError(f"policy: {data!r} must be a mapping of {', '.join(POLICY_FIELDS)}")
    unknown = [key for key in data if key not in POLICY_FIELDS]
    if unknown:
        raise _not_one_of("policy: key", unknown[0], POLICY_FIELDS)
    priority = data.get("priority", list(TYPES))
    if not isinstance(priority, list | tuple):
        raise PolicyError(f"policy.priority: {priority!r} must be a list of {', '.join(TYPES)}")
    for type_name in priority:
        if type_name not in TYPES:
            raise _not_one_of("policy.priority", type_name, TYPES)
    tables = {
        type_name: _type_from_dict(f"policy.{type_name}", type_name, data.get(type_name, {}))
        for type_name in TYPES
    }
    return Policy(
        name=data.get("name", default_name),
        allocator=data.get("allocator", "managed"),
        priority=tuple(priority),
        **tables,
    )


def _read_yaml(text: str, source: str) -> Any:
    try:
        return load_yaml(text, source)
    except TextFileError as error:
        raise PolicyError(f"policy file {error}") from None


@cache
def _presets() -> dict[str, Policy]:
    folder = resources.files("hpcmem.um").joinpath("presets")
    found = {}
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".yaml"):
            stem = entry.name.removesuffix(".yaml")
            found[stem] = policy_from_dict(_read_yaml(entry.read_text(), entry.name), stem)
    return found


class _Presets(Mapping):
    """Read-only mapping of preset name -> :class:`Policy`, loaded on first use."""

    def __getitem__(self, name: str) -> Policy:
        return _presets()[name]

    def __iter__(self):
        return iter(_presets())

    def __len__(self) -> int:
        return len(_presets())


#: The presets ``cuda``, ``um`` and ``hpcmem`` (and any other file in presets/).
PRESETS: Mapping[str, Policy] = _Presets()


def load_policy(name_or_path: str | Path | Policy) -> Policy:
    """A preset by name, a policy YAML file by path, or a :class:`Policy` unchanged."""
    if isinstance(name_or_path, Policy):
        return name_or_path
    text = str(name_or_path)
    if text in PRESETS:
        return PRESETS[text]
    path = Path(text)
    if path.suffix in (".yaml", ".yml") and path.is_file():
        try:
            text = read_text(path)
        except TextFileError as error:
            raise PolicyError(f"policy file {error}") from None
        return policy_from_dict(_read_yaml(text, str(path)), path.stem)
    raise PolicyError(
        f"unknown policy {text!r}: not one of {', '.join(PRESETS)}, or a policy YAML file (*.yaml)"
    )
