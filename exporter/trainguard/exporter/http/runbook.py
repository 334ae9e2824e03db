"""The runbook (alerts/runbook.md, shipped in the package) served as HTML at ``/runbook``.

Serving it makes the ``runbook_url`` of every alert work out of the box: by default it is
``http://<the alert's exporter>/runbook#<alertname lowercased>``. A site with its own wiki sets
the ``runbook_base`` threshold instead (alerts/README.md).

The Markdown is rendered just enough to read and to jump to: headings carry the anchors GitHub
would give them, fenced code stays preformatted, links and inline code keep their meaning,
everything else is escaped text in paragraphs. No Markdown library for one page.
"""

from __future__ import annotations

import html
import re
from importlib import resources

_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_LINK = re.compile(r"\[([^\]]+)\]\(([^)\s]+)\)")
_BOLD = re.compile(r"\*\*([^*]+)\*\*")


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lowercased, punctuation dropped, spaces to dashes."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _inline(text: str) -> str:
    """Escaped text with `code`, **bold** and [links](#x) of one paragraph line."""
    out = []
    pos = 0
    for part in re.finditer(r"`[^`]+`", text):  # code first: nothing inside it is markup
        out.append(_markup(text[pos : part.start()]))
        out.append(f"<code>{html.escape(part.group(0)[1:-1])}</code>")
        pos = part.end()
    out.append(_markup(text[pos:]))
    return "".join(out)


def _markup(text: str) -> str:
    escaped = html.escape(text, quote=True)
    escaped = _BOLD.sub(r"<strong>\1</strong>", escaped)

    def link(m: re.Match[str]) -> str:
        target = m.group(2)
        if not re.match(r"(#|https?://)", html.unescape(target)):
            return m.group(1)  # a path in the source tree means nothing here
        return f'<a href="{target}">{m.group(1)}</a>'

    return _LINK.sub(link, escaped)


def render(markdown: str) -> str:
    """The HTML page of a Markdown runbook."""
    body: list[str] = []
    para: list[str] = []
    code: list[str] | None = None

    def flush() -> None:
        if para:
            body.append("<p>" + "<br>\n".join(_inline(line) for line in para) + "</p>")
            para.clear()

    for line in markdown.splitlines():
        stripped = line.strip()
        if code is not None:
            if stripped.startswith("```"):
                body.append("<pre><code>" + html.escape("\n".join(code)) + "</code></pre>")
                code = None
            else:
                code.append(line)
            continue
        if stripped.startswith("```"):
            flush()
            code = []
            continue
        heading = _HEADING.match(line)
        if heading:
            flush()
            level, text = len(heading.group(1)), heading.group(2)
            body.append(f'<h{level} id="{anchor(text)}">{_inline(text)}</h{level}>')
        elif not stripped or stripped == "---":
            flush()
        else:
            para.append(stripped)
    flush()
    if code is not None:  # an unclosed fence: show what there is
        body.append("<pre><code>" + html.escape("\n".join(code)) + "</code></pre>")
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        "<title>trainguard runbook</title>"
        "<style>body{max-width:60em;margin:auto;font-family:sans-serif;line-height:1.4}"
        "pre{background:#f4f4f4;padding:.5em;overflow-x:auto}</style></head>\n<body>\n"
        + "\n".join(body)
        + "\n</body></html>\n"
    )


def page() -> bytes | None:
    """The shipped runbook as an HTML page.

    None if this installation lacks it (built without its package data).
    """
    try:
        text = resources.files("trainguard.exporter.http").joinpath("runbook.md").read_text("utf-8")
    except OSError:
        return None
    return render(text).encode()
