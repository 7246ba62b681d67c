"""The workflow config against its schema (``workflow/schemas/config.schema.yaml``), refused
in one line naming the key.

Snakemake's ``validate()`` fills in every default and checks every value, but its refusal
quotes the whole schema around the value at fault: 72 KB for an unknown top-level key.
:func:`validate_config` names an unknown key first, with the nearest accepted ones; any
other refusal is jsonschema's message about the value, the key it sits under and what the
schema says the key accepts. Either is a :class:`~hpcmem.workflow.config_checks.ConfigError`.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from hpcmem.errors import clip
from hpcmem.inputs import VALUE_LIMIT, read_yaml
from hpcmem.workflow.config_checks import ConfigError

__all__ = ["SCHEMA_DOCS", "check_known_keys", "validate_config"]

#: where every key of the config is described
SCHEMA_DOCS = "docs/configuration.md"
#: the most characters of jsonschema's message, and of what a key accepts, in a refusal
_PART_LIMIT = 200


def _key_path(path: Sequence[Any]) -> str:
    """``collectives.ops[0]`` for the path ``["collectives", "ops", 0]``."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else f"{'.' if text else ''}{part}"
    return text or "(the whole config)"


def _resolve(schema: Mapping[str, Any], node: Mapping[str, Any]) -> Mapping[str, Any]:
    """``node`` with a local ``$ref`` (``#/$defs/name``) followed: its own keys kept, its
    description followed by the definition's (what the key is, then its format)."""
    ref = node.get("$ref", "")
    if not ref.startswith("#/"):
        return node
    target: Mapping[str, Any] = schema
    for part in ref[2:].split("/"):
        target = target[part]
    described = " ".join(filter(None, (node.get("description"), target.get("description"))))
    return {**target, **{key: value for key, value in node.items() if key != "$ref"},
            "description": described}


def _unknown_keys(schema: Mapping[str, Any], node: Mapping[str, Any], value: Any,
                  path: tuple[Any, ...]) -> Iterator[ConfigError]:
    node = _resolve(schema, node)
    if not isinstance(value, Mapping):
        return
    properties = node.get("properties", {})
    for key, item in value.items():
        if key in properties:
            yield from _unknown_keys(schema, properties[key], item, (*path, key))
        elif node.get("additionalProperties") is False:
            accepted = list(properties)
            nearest = difflib.get_close_matches(str(key), accepted, n=3, cutoff=0.6)
            hint = (f"nearest: {', '.join(nearest)}" if nearest
                    else f"accepted here: {', '.join(accepted)}")
            name = key if isinstance(key, str) else repr(key)
            yield ConfigError(f"config {_key_path((*path, name))}: unknown key ({hint}; "
                              f"every key is described in {SCHEMA_DOCS})")


def check_known_keys(config: Mapping[str, Any], schema: Mapping[str, Any]) -> None:
    """Raise ConfigError naming the first key of ``config`` that ``schema`` does not
    define, where the schema closes its objects (``additionalProperties: false``).

    >>> schema = {"additionalProperties": False, "properties": {"collectives": {}}}
    >>> check_known_keys({"colectives": {}}, schema)
    Traceback (most recent call last):
    ...
    hpcmem.workflow.config_checks.ConfigError: config colectives: unknown key (nearest: \
collectives; every key is described in docs/configuration.md)
    """
    for error in _unknown_keys(schema, schema, config, ()):
        raise error


def _accepted(schema: Mapping[str, Any], path: Sequence[Any]) -> str | None:
    """The schema's description of the key at ``path`` (the deepest one described)."""
    node, found = _resolve(schema, schema), None
    for part in path:
        if isinstance(part, int):
            node = node.get("items", {})
        else:
            node = node.get("properties", {}).get(part, node.get("additionalProperties"))
        if not isinstance(node, Mapping):
            break
        node = _resolve(schema, node)
        found = node.get("description", found)
    return " ".join(found.split()) if found else None


def _problem(error: Any) -> str:
    """jsonschema's message about the value, a pattern's regular expression left out (the
    description of the key says it in words)."""
    if error.validator == "pattern":
        return f"{clip(repr(error.instance), VALUE_LIMIT)} does not match the key's pattern"
    return clip(error.message, _PART_LIMIT)


def validate_config(config: dict[str, Any], schema_path: str) -> None:
    """Fill in ``config``'s defaults and check it against the schema file, as Snakemake's
    ``validate()`` does; a refusal is one ConfigError line naming the key."""
    from jsonschema import ValidationError
    from snakemake.exceptions import WorkflowError
    from snakemake.utils import validate

    schema = read_yaml(schema_path)
    check_known_keys(config, schema)
    try:
        validate(config, schema=schema_path)
    except WorkflowError as error:
        found = error.__context__  # the ValidationError it was raised handling
        if not isinstance(found, ValidationError):
            raise
        path = list(found.absolute_path)
        accepted = _accepted(schema, path)
        raise ConfigError(f"config {_key_path(path)}: {_problem(found)}"
                          + (f" (accepted: {clip(accepted, _PART_LIMIT)})" if accepted
                             else "")) from None
