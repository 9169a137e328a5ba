"""HTML built on the server with every value escaped unless it is already :class:`Markup`.

The console renders user-generated text (memory content, messages, user keys, search queries),
so escaping is the default and the only way around it is to build :class:`Markup` from a
literal template. Nothing here reads a request or a database.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping
from urllib.parse import quote, urlencode


class Markup(str):
    """Text that is already HTML: never escaped again. Adding text to it escapes the text
    (``Markup + str`` is Markup, never a plain string that would be escaped twice)."""

    __slots__ = ()

    def __add__(self, other: str) -> Markup:
        return Markup(str.__add__(self, esc(other)))

    def __radd__(self, other: str) -> Markup:
        return Markup(str.__add__(esc(other), self))


def esc(value: object) -> Markup:
    """``value`` as HTML text: ``& < > " '`` escaped (so it is safe in an element or a quoted
    attribute); Markup passes unchanged; None is empty."""
    if isinstance(value, Markup):
        return value
    if value is None:
        return Markup("")
    return Markup(html.escape(str(value), quote=True))


def fmt(template: str, *args: object, **kwargs: object) -> Markup:
    """``template.format(...)`` with every argument escaped. ``template`` must be a literal."""
    return Markup(
        template.format(*(esc(a) for a in args), **{k: esc(v) for k, v in kwargs.items()})
    )


def join(parts: Iterable[object], separator: str = "") -> Markup:
    """The parts escaped and joined."""
    return Markup(separator.join(esc(p) for p in parts))


def url(path: str, params: Mapping[str, object | None] | None = None) -> str:
    """A console URL: ``path`` (segments already quoted with :func:`segment`) and the query of
    the parameters that are not None or empty. Escape it with :func:`esc` in an attribute."""
    query = {k: str(v) for k, v in (params or {}).items() if v is not None and v != ""}
    return path + ("?" + urlencode(query) if query else "")


def segment(value: object) -> str:
    """One path segment: everything but unreserved characters percent-encoded."""
    return quote(str(value), safe="")


def link(href: str, text: object, **attrs: str) -> Markup:
    extra = "".join(fmt(' {}="{}"', name.rstrip("_"), v) for name, v in attrs.items())
    return fmt('<a href="{}"', href) + Markup(extra) + fmt(">{}</a>", text)


def table(headers: Iterable[str], rows: Iterable[Iterable[object]], *, empty: str) -> Markup:
    """A table; each cell escaped unless Markup. ``empty``: what to say when there are no rows."""
    body = [Markup("<tr>" + "".join(fmt("<td>{}</td>", c) for c in row) + "</tr>") for row in rows]
    if not body:
        return fmt('<p class="empty">{}</p>', empty)
    head = "".join(fmt("<th>{}</th>", h) for h in headers)
    return Markup(f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>")


def hidden(name: str, value: object) -> Markup:
    return fmt('<input type="hidden" name="{}" value="{}">', name, value)


__all__ = ["Markup", "esc", "fmt", "hidden", "join", "link", "segment", "table", "url"]
