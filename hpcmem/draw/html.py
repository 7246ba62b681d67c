"""The HTML skeleton and style of ``hpcmem report``: one self-contained page, no external assets."""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence
from string import Template
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["PAGE", "badge", "folded_frame", "section", "table"]

PAGE = Template("""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="hpcmem $version">
<title>$title</title>
<style>
  :root { --ink:#1d2733; --muted:#5b6875; --line:#d9dee4; --bg:#f5f7f9; --card:#fff;
          --pass:#1b7f3b; --fail:#b3261e; --noisy:#b26a00; --new:#6b7785; --unjudged:#6a3d9a;
          --accent:#1f5f99; }
  * { box-sizing: border-box; }
  body { margin:0; background:var(--bg); color:var(--ink);
         font:15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif; }
  header { background:#17324d; color:#fff; padding:24px 40px; }
  header h1 { margin:0 0 4px; font-size:24px; font-weight:600; }
  header p { margin:0; color:#c9d6e3; }
  main { max-width:1240px; margin:0 auto; padding:24px 40px 48px; }
  section { background:var(--card); border:1px solid var(--line); border-radius:8px;
            padding:20px 24px; margin:0 0 20px; }
  h2 { margin:0 0 12px; font-size:19px; font-weight:600; }
  h3 { margin:18px 0 8px; font-size:16px; font-weight:600; color:var(--muted); }
  p.note { color:var(--muted); margin:4px 0 12px; }
  p.headline { font-size:17px; margin:0 0 12px; }
  p.alert { background:#fff4e5; border-left:4px solid var(--noisy); padding:8px 12px;
            margin:4px 0 12px; }
  figure { margin:8px 0 20px; }
  figure img { display:block; max-width:100%; height:auto; border:1px solid var(--line);
               border-radius:4px; }
  figcaption { color:var(--muted); font-size:13px; margin-top:6px; }
  table { border-collapse:collapse; width:100%; font-size:13px; margin:4px 0 8px; }
  th, td { text-align:left; padding:5px 10px; border-bottom:1px solid var(--line);
           vertical-align:top; }
  th { background:#eef1f4; font-weight:600; }
  td.num { text-align:right; font-variant-numeric:tabular-nums; white-space:nowrap; }
  td.key { font-family:ui-monospace, "DejaVu Sans Mono", monospace; font-size:12px;
           overflow-wrap:anywhere; min-width:16em; }
  .badge { display:inline-block; padding:2px 10px; border-radius:12px; color:#fff;
           font-weight:600; font-size:13px; letter-spacing:.02em; }
  .PASS { background:var(--pass); } .FAIL { background:var(--fail); }
  .NOISY { background:var(--noisy); } .UNJUDGED { background:var(--unjudged); }
  .NEW, .MISSING, .NONE { background:var(--new); }
  header .badge { font-size:15px; margin-left:12px; vertical-align:middle; }
  dl.meta { display:grid; grid-template-columns:max-content 1fr; gap:4px 24px; margin:0; }
  dl.meta dt { color:var(--muted); } dl.meta dd { margin:0; word-break:break-all; }
  details summary { cursor:pointer; color:var(--accent); margin:8px 0; }
</style>
</head>
<body>
<header>
<h1>$title $badge</h1>
<p>$subtitle</p>
</header>
<main>
$body
</main>
</body>
</html>
""")


def badge(verdict: str | None, label: str | None = None) -> str:
    """A coloured verdict badge (PASS, FAIL, NOISY, NEW, MISSING, UNJUDGED) saying ``label``
    (else the verdict), or a grey 'not checked'."""
    if verdict is None:
        return '<span class="badge NONE">not checked</span>'
    text = verdict if label is None else label
    return f'<span class="badge {html.escape(verdict)}">{html.escape(text)}</span>'


def section(title: str, *parts: str, anchor: str = "") -> str:
    """A card with a heading and already-escaped HTML parts."""
    ident = f' id="{html.escape(anchor)}"' if anchor else ""
    return f"<section{ident}>\n<h2>{html.escape(title)}</h2>\n" + "\n".join(parts) + "\n</section>"


def _cell(value: Any, kind: str) -> str:
    if kind == "raw":
        return f"<td>{value}</td>"
    if value is None or (isinstance(value, float) and value != value):
        text = "-"
    elif isinstance(value, float):
        text = f"{value:.4g}"
    else:
        text = str(value)
    if kind == "key":  # long figure keys and paths: break after a slash, not mid-word
        return f'<td class="key">{html.escape(text).replace("/", "/<wbr>")}</td>'
    cls = ' class="num"' if kind == "num" else ""
    return f"<td{cls}>{html.escape(text)}</td>"


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]],
          kinds: Sequence[str] | None = None) -> str:
    """An HTML table; ``kinds`` per column: ``text``, ``num``, ``key`` (monospace) or ``raw``."""
    kinds = kinds or ["text"] * len(headers)
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "\n".join(
        "<tr>" + "".join(_cell(v, k) for v, k in zip(row, kinds, strict=True)) + "</tr>"
        for row in rows
    )
    return f"<table>\n<thead><tr>{head}</tr></thead>\n<tbody>\n{body}\n</tbody>\n</table>"


def folded_frame(frame: pd.DataFrame, title: str) -> str:
    """A summary table folded under ``title``: numbers right-aligned, missing values as -."""
    import pandas as pd

    kinds = ["num" if frame[c].dtype.kind in "fiu" else "text" for c in frame.columns]
    rows = [[None if pd.isna(v) else v for v in row]
            for row in frame.astype(object).itertuples(index=False)]
    body = table(list(frame.columns), rows, kinds)
    return f"<details><summary>{html.escape(title)}</summary>{body}</details>"
