"""Where ``hpcmem export --to`` pushes: the server's URL, the format, InfluxDB's database or
org and bucket, the token from the environment; each checked before anything is read or
sent (BadInputError naming the option, the value and what is accepted)."""

from __future__ import annotations

import urllib.parse
from dataclasses import dataclass, field

from hpcmem.inputs import InputError, matching, refused

__all__ = ["PUSHED", "TOKEN", "Destination", "destination"]

#: the environment variable holding the token (never an option: the command line is public)
TOKEN = "HPCMEM_EXPORT_TOKEN"
#: formats a server takes
PUSHED = ("influx", "gelf", "httpjson")
_NAME = r"[A-Za-z0-9._-]{1,64}"
_NAME_ACCEPTED = "1 to 64 letters, digits, '.', '_' or '-'"


@dataclass(frozen=True)
class Destination:
    """Where and how to push: the server's URL, the format, and InfluxDB's settings."""

    url: str
    format: str
    database: str | None = None
    bucket: str | None = None
    org: str | None = None
    token: str | None = field(default=None, repr=False)

    @property
    def what(self) -> str:
        """The destination in words, for messages."""
        if self.format == "influx" and self.bucket:
            return f"InfluxDB 2.x bucket {self.bucket!r} of org {self.org!r} at {self.url}"
        if self.format == "influx":
            return f"InfluxDB 1.x database {self.database!r} at {self.url}"
        return f"{'Graylog GELF' if self.format == 'gelf' else 'HTTP JSON'} endpoint {self.url}"


def _url(url: str) -> str:
    accepted = "http:// or https://, a host, an optional port and path"
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise refused("--to", url, "is not an HTTP URL", accepted)
    if parts.username or parts.password:
        raise refused("--to", url, "holds credentials (the command line is public)",
                      f"a URL without them; put the token in ${TOKEN}")
    if parts.query or parts.fragment:
        raise refused("--to", url, "holds a query", f"{accepted}; InfluxDB's database, org "
                      "and bucket as --database, --org, --bucket")
    return url


def destination(url: str, format: str, *, database: str | None = None,
                org: str | None = None, bucket: str | None = None,
                token: str | None = None) -> Destination:
    """The destination the options name, once each is usable."""
    url = _url(url)
    if format not in PUSHED:
        raise refused("--format", format, "is not pushed to a server",
                      f"{', '.join(PUSHED)} with --to; write {format} with --out")
    given = {"--database": database, "--org": org, "--bucket": bucket}
    versions = "--database for InfluxDB 1.x, or --org and --bucket for InfluxDB 2.x"
    if format != "influx":
        for option, value in given.items():
            if value is not None:
                raise refused(option, value, f"is no setting of --format {format}",
                              "--database, --org and --bucket with --format influx only")
    elif database is None and bucket is None:
        raise InputError(f"--database, --bucket: neither is given (accepted: {versions})")
    elif database is not None and bucket is not None:
        raise InputError(f"--database {database!r}, --bucket {bucket!r}: both are given "
                         f"(accepted: {versions})")
    elif (org is None) == (database is None):
        raise InputError(f"--org: {'not given' if org is None else repr(org)} with "
                         f"{'--bucket' if database is None else '--database'} (accepted: "
                         f"{versions})")
    for option, value in given.items():
        if value is not None:
            matching(value, _NAME, option, what="a name", accepted=_NAME_ACCEPTED)
    return Destination(url, format, database, bucket, org, token or None)
