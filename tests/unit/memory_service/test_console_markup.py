"""The console's markup: every value is escaped unless it is already Markup."""

from __future__ import annotations

from memory_service.console.markup import Markup, esc, fmt, hidden, join, link, table, url
from memory_service.console.search import snippet

ATTACKS = ["<script>alert(1)</script>", '"><img src=x onerror=alert(1)>', "' onmouseover='x"]


def test_esc_escapes_every_html_special_character() -> None:
    assert esc("<a href=\"x\" title='y'>&</a>") == (
        "&lt;a href=&quot;x&quot; title=&#x27;y&#x27;&gt;&amp;&lt;/a&gt;"
    )
    assert esc(None) == ""
    assert esc(3) == "3"


def test_markup_is_not_escaped_twice() -> None:
    once = esc("<b>")
    assert esc(once) == "&lt;b&gt;"
    assert isinstance(once, Markup)


def test_fmt_escapes_its_arguments_but_not_its_template() -> None:
    for attack in ATTACKS:
        out = fmt('<p title="{}">{}</p>', attack, attack)
        assert out.startswith('<p title="') and out.endswith("</p>")
        assert "<script" not in out and "<img" not in out
        assert '"' not in out[len('<p title="') : out.index('">')]
        assert "'" not in out


def test_links_tables_and_fields_escape_values() -> None:
    href = url("/console/person", {"agent": "bot", "user": ATTACKS[1], "kind": None})
    assert href == "/console/person?agent=bot&user=%22%3E%3Cimg+src%3Dx+onerror%3Dalert%281%29%3E"
    anchor = link(href, ATTACKS[0])
    assert "<script>" not in anchor and "&lt;script&gt;" in anchor
    cells = table(["h"], [[ATTACKS[0]], [Markup("<em>ok</em>")]], empty="none")
    assert "&lt;script&gt;" in cells and "<em>ok</em>" in cells
    assert table(["h"], [], empty="<none>") == '<p class="empty">&lt;none&gt;</p>'
    assert hidden("csrf", ATTACKS[1]) == (
        '<input type="hidden" name="csrf" value="&quot;&gt;&lt;img src=x onerror=alert(1)&gt;">'
    )
    assert join(["<a>", Markup("<b>")], ",") == "&lt;a&gt;,<b>"


def test_a_snippet_lets_only_the_highlight_marks_through() -> None:
    out = snippet("<mark>Dana</mark> <script>x</script> <img src=x onerror=y>")
    assert out == "<mark>Dana</mark> &lt;script&gt;x&lt;/script&gt; &lt;img src=x onerror=y&gt;"


def test_adding_to_markup_escapes_the_text_once() -> None:
    assert Markup("<p>") + "<b>" == "<p>&lt;b&gt;"
    assert "<b>" + Markup("<p>") == "&lt;b&gt;<p>"
    assert isinstance(Markup("<p>") + Markup("</p>"), Markup)
    assert esc(Markup("<p>") + Markup("</p>")) == "<p></p>"
