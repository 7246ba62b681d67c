"""The workflow config, refused in one line naming the key or the file: its files read
first, then its values against the schema, then what the schema cannot say.

1. **Files.** Snakemake loads a profile's settings, its sweep files and every
   ``--configfile`` while it parses its command line, before the Snakefile runs: a file
   that is not UTF-8 text ends it in a ``UnicodeDecodeError`` traceback, an alias bomb
   takes minutes and gigabytes, ``/dev/zero`` is read for ever. :func:`check_profile` reads
   them with :func:`read_config_file` instead, so each is one line naming the option and the
   file, at once. The documented entry points call it before they start Snakemake:
   ``hpcmem preflight``, ``tools/nightly.sh`` (through ``python -m hpcmem.nightly check``)
   and ``tools/run-workflow.sh``, which runs::

       python -m hpcmem.workflow.config PROFILE -- SNAKEMAKE_ARGS...

   (one line, ``hpcmem: error: ...``, and exit status 2 for a file it refuses).
2. **Schema.** Snakemake's ``validate()`` fills in every default and checks every value
   against ``workflow/schemas/config.schema.yaml``, but its refusal quotes the whole schema
   around the value at fault: 72 KB for an unknown top-level key. :func:`validate_config`
   names an unknown key first, with the nearest accepted ones; any other refusal is
   jsonschema's message about the value, the key it sits under and what the schema says the
   key accepts.
3. **Checks.** :func:`check_config` runs what needs more than a value at a time (the names a
   sweep defines, the files on disk, two sizes compared) before any job exists.

The workflow turns a :class:`ConfigError` into the one-line error Snakemake prints.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import os
import stat
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from hpcmem.errors import BadInputError, HpcmemError, clip
from hpcmem.inputs import VALUE_LIMIT, InputError, read_yaml, refused, whole_number, yaml_mapping
from hpcmem.node.planned import BINDINGS
from hpcmem.textfiles import TextFileError
from hpcmem.um import PRESETS
from hpcmem.units import parse_size
from hpcmem.workflow.profiles import ProfileChoice, resolve_profile
from hpcmem.workflow.refusal import REFUSED

__all__ = ["MAX_BYTES", "SCHEMA_DOCS", "ConfigError", "check_config", "check_folder",
           "check_known_keys", "check_names", "check_not_builtin", "check_printable",
           "check_profile", "check_train_layouts", "given_configfiles", "main", "message_size",
           "read_config_file", "validate_config"]


class ConfigError(HpcmemError, ValueError):
    """A config the run cannot use; the message names the key."""


#: the most bytes a config file may hold (a sweep or a profile is a few kilobytes)
MAX_BYTES = 1 << 20
#: the most points of a group in one Slurm job a profile may ask for
_MOST_COMPONENTS = 100_000
#: snakemake's options naming config files, and the shortest abbreviation argparse takes
_CONFIGFILE_OPTIONS = ("--configfile", "--configfiles")
_SHORTEST = "--configf"


def given_configfiles(snakemake_args: Sequence[str]) -> list[str]:
    """The files a snakemake command line gives with ``--configfile`` (or ``--configfiles``,
    an abbreviation argparse accepts, ``--configfile=FILE``), as argparse reads them: each
    word after the option up to the next option.

    >>> given_configfiles(["-n", "--configfile", "a.yaml", "b.yaml", "--configf=c.yaml", "all"])
    ['a.yaml', 'b.yaml', 'c.yaml']
    """
    files: list[str] = []
    taking = False
    for word in snakemake_args:
        if word.startswith("-") and word != "-":
            name, equals, value = word.partition("=")
            names_files = name.startswith(_SHORTEST) and any(
                option.startswith(name) for option in _CONFIGFILE_OPTIONS)
            taking = names_files and not equals  # FILE=... takes one word, the rest are targets
            if names_files and equals:
                files.append(value)
        elif taking:
            files.append(word)
    return files


def _sweep_files(folder: Path, named: Any) -> list[Path]:
    """The files a profile's ``configfile`` names, found as Snakemake finds them: one name
    in the profile's folder first, a list of names as given."""
    if named is None:
        return []
    if isinstance(named, list):
        return [Path(str(name)) for name in named]
    name = os.path.expanduser(os.path.expandvars(str(named)))
    return [folder / name if (folder / name).exists() else Path(name)]


def read_config_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The settings in the config file ``path``: a regular file (not a device or a pipe,
    which could be read for ever) of at most :data:`MAX_BYTES`, holding a mapping in UTF-8
    YAML without aliases; TextFileError names the file and why not."""
    with contextlib.suppress(OSError):  # unreadable: yaml_mapping says why
        found = os.stat(path)
        if not stat.S_ISREG(found.st_mode):
            raise TextFileError(f"{path}: not a regular file (a config file is YAML text)")
        if found.st_size > MAX_BYTES:
            raise TextFileError(f"{path}: {found.st_size} bytes, more than a config file "
                                f"holds (at most {MAX_BYTES})")
    return yaml_mapping(path)


def _mapping(path: Path, field: str) -> dict[str, Any]:
    try:
        return read_config_file(path)
    except TextFileError as error:
        raise InputError(f"{field}: {error}") from None


def _check_group_components(value: Any, field: str) -> None:
    """A profile's ``group-components`` (``{GROUP: N}`` or ``[GROUP=N, ...]``): N, the
    points of the group in one Slurm job, a whole number of at least 1. Snakemake refuses
    other values without naming the group or the value."""
    if value is None:
        return
    if isinstance(value, dict):
        entries = list(value.items())
    elif isinstance(value, list) and all(isinstance(entry, str) for entry in value):
        entries = [entry.partition("=")[::2] for entry in value]
    else:
        raise refused(f"{field}: group-components", value, "is not a mapping",
                      "GROUP: N, N points of the group in each Slurm job")
    for group, count in entries:
        whole_number(count, f"{field}: group-components: {group}", minimum=1,
                     maximum=_MOST_COMPONENTS)


def check_profile(profile: str | None, configfiles: Sequence[str] | None = None, *,
                  field: str = "--profile") -> ProfileChoice | None:
    """Read what ``snakemake --profile PROFILE [--configfile FILE...]`` reads first: the
    profile's settings (found by :func:`~hpcmem.workflow.profiles.resolve_profile`, which
    is returned), then the sweep files (those given, else those the profile names). Each
    must be a mapping in UTF-8 YAML without aliases; BadInputError names ``field`` (or
    ``--configfile``) and the file. The profile's ``group-components`` must be whole
    numbers of at least 1, each named when not."""
    sweeps = [Path(name) for name in configfiles or ()]
    choice = None
    if profile is not None:
        choice = resolve_profile(profile, field)
        mapping = _mapping(choice.settings, field)
        _check_group_components(mapping.get("group-components"), f"{field} {profile}")
        sweeps = sweeps or _sweep_files(choice.folder, mapping.get("configfile"))
    for path in sweeps:
        _mapping(path, "--configfile" if configfiles else field)
    return choice


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
    hpcmem.workflow.config.ConfigError: config colectives: unknown key (nearest: \
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


def message_size(value: Any, key: str) -> int:
    """Bytes of a message size (8, '4K', '1M'), parsed as `hpcmem collectives` parses it;
    not a power of two stops naming ``key``."""
    size = parse_size(str(value))
    if size & (size - 1):
        raise ConfigError(f"config {key}: {value!r} is not a power of two (8, 4K, 1M, ...)")
    return size


def check_printable(value: Any, key: str = "config") -> None:
    """Stop naming the key when a string holds a control character (the schema's patterns
    end in ``$``, which Python's re also matches before a final newline)."""
    if isinstance(value, dict):
        for name, item in value.items():
            check_printable(name, key)
            check_printable(item, f"{key}.{name}" if key != "config" else name)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            check_printable(item, f"{key}[{index}]")
    elif isinstance(value, str) and not value.isprintable():
        raise ConfigError(f"config {key}: {value!r} contains a control character")


def check_names(key: str, names: Iterable[str], builtin: Iterable[str],
                defined: Iterable[str], defined_key: str) -> None:
    """Stop naming ``key`` when a name is neither built in nor defined under ``defined_key``."""
    accepted = (*builtin, *defined)
    for name in names:
        if name not in accepted:
            raise ConfigError(f"config {key}: {name!r} is not one of {', '.join(accepted)} "
                              f"(define new ones under {defined_key})")


def check_not_builtin(key: str, defined: Iterable[str], builtin: Iterable[str]) -> None:
    """Stop naming ``key`` when a name defined there would shadow a built-in one."""
    builtin = tuple(builtin)
    for name in defined:
        if name in builtin:
            raise ConfigError(f"config {key}: {name!r} is a built-in name (built in: "
                              f"{', '.join(builtin)}); give yours another name")


def check_folder(key: str, path: str) -> None:
    """Stop naming ``key`` when ``path`` exists and is not a folder."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise ConfigError(f"config {key}: {path!r} is a file, not a folder")


def check_config(config: Mapping[str, Any]) -> None:
    """Every check of a schema-valid config, in the order a run meets them."""
    collectives, train = config["collectives"], config["train"]
    check_printable(config)
    check_folder("output_dir", config["output_dir"])
    check_folder("check.history", config["check"]["history"])
    if not (collectives["enabled"] or train["enabled"]):
        raise ConfigError("config collectives.enabled, train.enabled: both false, nothing to run")
    if message_size(collectives["min_size"], "collectives.min_size") > message_size(
            collectives["max_size"], "collectives.max_size"):
        raise ConfigError("config collectives.min_size: larger than collectives.max_size")
    check_not_builtin("collectives.custom_bindings", collectives["custom_bindings"], BINDINGS)
    check_not_builtin("train.policy_files", train["policy_files"], PRESETS)
    check_names("collectives.bindings", collectives["bindings"], BINDINGS,
                collectives["custom_bindings"], "collectives.custom_bindings")
    check_names("train.policies", train["policies"], PRESETS, train["policy_files"],
                "train.policy_files")
    check_train_layouts(train)


#: each model's own micro-batch (``hpcmem train --batch`` left out)
_DEFAULT_BATCH = {"transformer": 8, "cnn": 256}


def check_train_layouts(train: Mapping[str, Any]) -> None:
    """The training sweep's GPU counts: one layout each, each dividing the batch, and the
    cpu device with the cuda policy alone.

    >>> check_train_layouts({"nodes": [1, 2], "gpus_per_node": [1, 2], "batch": None,
    ...                      "models": ["transformer"], "device": "cuda", "policies": ["um"]})
    Traceback (most recent call last):
    ...
    hpcmem.workflow.config.ConfigError: config train.nodes, train.gpus_per_node: 1 x 2 and \
2 x 1 are both 2 GPUs (accepted: one layout per GPU count, as a point's key names the \
count only)
    """
    nodes, per_node = train.get("nodes", [1]), train.get("gpus_per_node", [1])
    seen: dict[int, tuple[int, int]] = {}
    for n in nodes:
        for g in per_node:
            if n * g in seen:
                a, b = seen[n * g]
                raise ConfigError(f"config train.nodes, train.gpus_per_node: {a} x {b} and "
                                  f"{n} x {g} are both {n * g} GPUs (accepted: one layout per "
                                  "GPU count, as a point's key names the count only)")
            seen[n * g] = (n, g)
    for model in train.get("models", []):
        batch = train.get("batch") or _DEFAULT_BATCH.get(model)
        for gpus in sorted(seen):
            if batch and batch % gpus:
                key = ("train.batch" if train.get("batch")
                       else f"train.models ({model}'s own batch)")
                raise ConfigError(f"config {key}: {batch} samples do not split evenly between "
                                  f"{gpus} GPUs (train.nodes x train.gpus_per_node; accepted: "
                                  f"a batch that is a multiple of every GPU count)")
    if train.get("device") == "cpu" and set(train.get("policies", [])) - {"cuda"}:
        others = sorted(set(train["policies"]) - {"cuda"})
        raise ConfigError(f"config train.policies: {', '.join(others)} with train.device cpu "
                          "(accepted on the cpu device: cuda only)")


def main(argv: list[str] | None = None) -> int:
    """``python -m hpcmem.workflow.config PROFILE -- SNAKEMAKE_ARGS...``: the files
    ``snakemake --profile PROFILE SNAKEMAKE_ARGS...`` would read first; one line and exit
    status 2 for the first one refused."""
    parser = argparse.ArgumentParser(prog="python -m hpcmem.workflow.config",
                                     description=main.__doc__)
    parser.add_argument("profile", help="the profile snakemake is given")
    parser.add_argument("snakemake_args", nargs="*", help="the rest of its arguments")
    args = parser.parse_args(argv)
    try:
        check_profile(args.profile, given_configfiles(args.snakemake_args))
    except BadInputError as error:
        print(f"{REFUSED}{error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
