"""Text and YAML files read safely: bytes decoded with a clear error, YAML without aliases.

Every file hpcmem reads as text (references, policies, verdicts, the workflow config) goes
through :func:`read_text`, which reads bytes and refuses a file that is not UTF-8 text, and
YAML through :func:`load_yaml`, which refuses aliases (``*name``): none of hpcmem's formats
needs them, and a few nested ones expand to gigabytes (an alias bomb). Error messages show
at most :data:`hpcmem.errors.MESSAGE_LIMIT` characters of the offending text.
"""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path
from typing import Any

from hpcmem.errors import BadInputError, clip

__all__ = ["TextFileError", "decode_text", "load_yaml", "read_text", "read_yaml"]


class TextFileError(BadInputError):
    """A file that cannot be read, is not UTF-8 text, or is not alias-free YAML."""


#: bytes shown on either side of the first one that is not text
_NEAR = 24


def _near(data: bytes, offset: int) -> str:
    """The bytes around ``offset`` on its line, as Python writes bytes (``b'caf\\xe9'``)."""
    start = max(data.rfind(b"\n", 0, offset) + 1, offset - _NEAR)
    end = data.find(b"\n", offset)
    end = min(len(data) if end < 0 else end, offset + 1 + _NEAR)
    return repr(data[start:end])


def decode_text(data: bytes, source: str) -> str:
    """``data`` decoded as UTF-8; TextFileError names the first byte that is not text and
    shows the bytes around it (a file's, or what a command printed)."""
    if (nul := data.find(b"\0")) >= 0:
        raise TextFileError(f"{source}: not a text file (NUL byte at offset {nul}): "
                            f"near {_near(data, nul)}")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise TextFileError(
            f"{source}: not UTF-8 text (byte 0x{data[error.start]:02x} at offset {error.start}): "
            f"near {_near(data, error.start)}"
        ) from None


def read_text(path: str | os.PathLike[str]) -> str:
    """The UTF-8 text of ``path``; TextFileError names the path and the reason."""
    try:
        data = Path(path).read_bytes()
    except OSError as error:
        raise TextFileError(f"{path}: cannot read ({error.strerror or error})") from None
    return decode_text(data, str(path))


@cache
def _loader() -> type:
    import yaml

    class NoAliasLoader(yaml.SafeLoader):  # the pure-Python one: its composer can be extended
        """SafeLoader that stops at the first alias instead of expanding it."""

        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.check_event(yaml.AliasEvent):
                mark = self.peek_event().start_mark
                raise yaml.composer.ComposerError(
                    None, None, "aliases (*name) are not accepted", mark
                )
            return super().compose_node(parent, index)

    return NoAliasLoader


def load_yaml(text: str, source: str) -> Any:
    """The YAML document in ``text``; TextFileError names ``source``, the line and the problem."""
    import yaml

    try:
        return yaml.load(text, Loader=_loader())  # a SafeLoader subclass
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"{source}:{mark.line + 1}" if mark else source
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise TextFileError(f"{where}: not valid YAML ({clip(problem)})") from None


def read_yaml(path: str | os.PathLike[str]) -> Any:
    """The YAML document in the file ``path``, read with :func:`read_text` and :func:`load_yaml`."""
    return load_yaml(read_text(path), str(path))
