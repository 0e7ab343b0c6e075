"""The head-training corpus (:mod:`engine.heads.corpus`): its source segments."""

import ast

import pytest

from engine.heads import corpus

AWKWARD = (
    "def first(a):\r\n    '''CRLF ends.'''\r\n    return a\r\n\r\n"
    "class Second:\r    '''Lone CR ends.'''\r    x = 1\r\n"
    "\f\ndef third(é='ü'):  # form feed above, non-ASCII here\n"
    "    '''ümlaut «docs»'''\n    return é + 'ß'\n"
    "def fourth(): return 4"
)


@pytest.mark.parametrize("source", [AWKWARD, AWKWARD.replace("\r\n", "\n")],
                         ids=["mixed-ends", "newlines"])
def test_segments_equal_the_parsers_own(source: str) -> None:
    tree = ast.parse(source)
    lines = corpus.source_lines(source)
    assert "".join(lines) == source
    for node in tree.body:
        assert isinstance(node, ast.stmt)
        assert corpus.segment(lines, node) == ast.get_source_segment(source, node), node.lineno


def test_a_standard_library_module_gives_the_parsers_segments() -> None:
    module, source = next(corpus.module_sources())  # argparse: ~2,600 lines
    tree = ast.parse(source)
    found = list(corpus.definitions(tree, source))
    assert len(found) > 10, module
    by_name = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)}
    for d in found:
        assert d.code == ast.get_source_segment(source, by_name[d.name]), d.name
