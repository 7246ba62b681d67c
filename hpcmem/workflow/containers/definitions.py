"""Apptainer definition files, parsed as Apptainer parses them far enough to refuse what it
would refuse (no ``Bootstrap`` header, an unknown agent or section, a ``{{ VARIABLE }}``
without a value, a build argument that would break the text), and rendered as it builds them.

Multi-stage definitions are read stage by stage: a ``Bootstrap:`` line starts the next one,
and ``%files from STAGE`` copies from a stage, not from the host.

Example::

    definition = parse_definition("containers/hpcmem-cpu.def")
    definition.check_arguments({"DEBIAN": "trixie"})
    definition.scripts("post", {"DEBIAN": "trixie"})   # each stage's %post, rendered
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from hpcmem.workflow.containers.apptainer import ContainerError

__all__ = ["AGENTS", "SECTIONS", "Definition", "parse_definition"]

#: Apptainer's bootstrap agents
AGENTS = frozenset({
    "library", "docker", "docker-daemon", "docker-archive", "oci", "oci-archive", "shub",
    "oras", "localimage", "debootstrap", "yum", "dnf", "zypper", "arch", "busybox", "scratch",
})  # fmt: skip
#: Apptainer's definition sections (app sections take the app's name after them)
SECTIONS = frozenset({
    "arguments", "setup", "files", "environment", "post", "runscript", "startscript", "test",
    "labels", "help", "appinstall", "appenv", "apprun", "applabels", "appfiles", "apphelp",
    "apptest", "appstart",
})  # fmt: skip
_VARIABLE = re.compile(r"\{\{\s*(\w+)\s*\}\}")

@dataclass(frozen=True)
class Definition:
    """A parsed definition file: its text, the sections it has, its ``{{ variables }}``, and
    each stage's header (keys in lower case)."""

    path: Path
    text: str
    sections: tuple[str, ...]
    arguments: Mapping[str, str]
    variables: frozenset[str]
    headers: tuple[Mapping[str, str], ...] = ()

    def check_arguments(self, given: Mapping[str, str], workflow: Sequence[str] = ()) -> None:
        """Every ``{{ VAR }}`` has a value: a default in ``%arguments``, ``given``, or one of
        ``workflow`` (the names the workflow passes at build time); every value given is one
        word of printable characters (it is pasted into the definition's text)."""
        for name, value in given.items():
            if not value or not value.isprintable() or any(c.isspace() for c in value):
                raise ContainerError(f"{self.path}: build argument {name}={value!r} is not one "
                                     "word of printable characters")  # fmt: skip
        known = {*self.arguments, *given, *workflow}
        missing = sorted(self.variables - known)
        if missing:
            raise ContainerError(
                f"{self.path}: {{{{ {missing[0]} }}}} has no value: give it a default in "
                "%arguments"
            )

    def uses(self, name: str) -> bool:
        """Whether ``{{ name }}`` appears in the definition or ``%arguments`` declares it."""
        return name in self.arguments or name in self.variables

    def build_args(self, values: Mapping[str, str]) -> dict[str, str]:
        """The ``--build-arg`` values this definition uses, out of ``values``."""
        return {name: value for name, value in values.items() if self.uses(name)}

    def render(self, values: Mapping[str, str]) -> str:
        """The text Apptainer builds: every ``{{ VAR }}`` replaced by its value in ``values``,
        else its ``%arguments`` default (an unknown one by nothing)."""
        return self._fill(self.text, values)

    def _fill(self, text: str, values: Mapping[str, str]) -> str:
        return _VARIABLE.sub(lambda m: values.get(m[1], self.arguments.get(m[1], "")), text)

    def bases(self, values: Mapping[str, str]) -> list[tuple[str, str]]:
        """``(agent, From:)`` of each stage that names a base, its ``{{ VAR }}`` filled as
        :meth:`render` fills them."""
        return [(header["bootstrap"].lower(), self._fill(header["from"], values))
                for header in self.headers if "from" in header]

    def scripts(self, section: str, values: Mapping[str, str]) -> list[str]:
        """The rendered body of every ``%section`` (one per stage), as the shell runs it."""
        return ["\n".join(body) + "\n" for _, body in _sections(self.render(values), section)]

    def files_variables(self) -> frozenset[str]:
        """The ``{{ VAR }}`` names the ``%files`` lines use (their values are paths)."""
        return frozenset(name for line in _section_lines(self.text, "files")
                         for name in _VARIABLE.findall(line))  # fmt: skip

    def files_sources(self, values: Mapping[str, str]) -> list[str]:
        """The host sources of the ``%files`` lines (not ``%files from STAGE``), with
        ``{{ VAR }}`` filled from ``values``."""
        return [line.split()[0] for line in _section_lines(self.render(values), "files")]


def _section_name(line: str) -> str:
    """``post`` of ``%post`` (and of ``%files from stage``)."""
    return (line[1:].split() or [""])[0]


def _sections(text: str, name: str) -> Iterator[tuple[str, list[str]]]:
    """``(opening line, body lines)`` of every ``%name`` section; a section ends at the next
    one or at the next stage's ``Bootstrap:`` line."""
    opening, body = None, []
    for line in [*text.splitlines(), "%"]:
        if line.startswith("%") or re.match(r"bootstrap\s*:", line, re.IGNORECASE):
            if opening is not None:
                yield opening, body
            opening, body = (line, []) if _section_name(line) == name else (None, [])
        elif opening is not None:
            body.append(line)


def _section_lines(text: str, name: str) -> Iterator[str]:
    """The non-blank, non-comment lines of every ``%name`` section taking nothing from another
    stage (not ``%files from build``)."""
    for opening, body in _sections(text, name):
        if len(opening.split()) == 1:
            yield from (line.strip() for line in body
                        if line.strip() and not line.lstrip().startswith("#"))  # fmt: skip


def _check_header(header: dict[str, str], where: str) -> None:
    """A stage's header has a ``Bootstrap`` line."""
    if "bootstrap" not in header:
        raise ContainerError(f"{where}: no 'Bootstrap: AGENT' header before it")


def parse_definition(path: str | os.PathLike[str]) -> Definition:
    """Parse a definition file as Apptainer does, far enough to refuse what it would refuse:
    no ``Bootstrap`` header, an unknown agent, an unknown section. Errors name ``FILE:LINE``.
    A path that is not a regular file (a device, a pipe) is refused unread."""
    source = Path(path)
    try:
        if not stat.S_ISREG(source.stat().st_mode):  # a device or a pipe: read for ever
            raise ContainerError(f"{source}: not a regular file (a definition is text)")
        text = source.read_text()
    except (OSError, UnicodeDecodeError) as error:
        raise ContainerError(f"{source}: cannot read the definition ({error})") from None
    sections: list[str] = []
    arguments: dict[str, str] = {}
    header: dict[str, str] | None = {}  # the header being read; None inside the sections
    headers = [header]
    current = ""
    for number, line in enumerate(text.splitlines(), 1):
        content = line.strip()
        if not content or content.startswith("#"):
            continue
        where = f"{source}:{number}"
        if line.startswith("%"):
            if header is not None:
                _check_header(header, where)
            header, current = None, _section_name(line)
            if current not in SECTIONS:
                known = ", ".join(f"%{name}" for name in sorted(SECTIONS))
                raise ContainerError(f"{where}: unknown section %{current} (one of {known})")
            sections.append(current)
            continue
        if header is None and re.match(r"bootstrap\s*:", line, re.IGNORECASE):
            header = {}  # the next stage of a multi-stage definition
            headers.append(header)
        if header is not None:
            key, colon, value = content.partition(":")
            if not colon or not re.fullmatch(r"[A-Za-z]\w*", key.strip()):
                raise ContainerError(f"{where}: {content!r} is not a 'KEY: VALUE' header line")
            header[key.strip().lower()] = value.strip()
            if key.strip().lower() == "bootstrap" and value.strip().lower() not in AGENTS:
                known = ", ".join(sorted(AGENTS))
                raise ContainerError(f"{where}: Bootstrap {value.strip()!r} is not an agent "
                                     f"({known})")
        elif current == "arguments":
            name, _, value = content.partition("=")
            arguments[name.strip()] = value.strip()
    if header is not None:
        _check_header(header, str(source))
    variables = frozenset(_VARIABLE.findall(text))
    return Definition(source, text, tuple(sections), arguments, variables, tuple(headers))
