"""The head-training corpus: chat turns built from the Python standard library's source.

Contract: :func:`build` turns a fixed list of pure-Python standard-library modules into
chat conversations (a user asks for a function, a class or an explanation; the assistant
answers with that code in a code block or with its docstring) and writes them as JSON
lines; :func:`load` reads them back as message lists. The shipped file is
``assets/heads/corpus.jsonl`` (built from CPython 3.11's library, which the Python
Software Foundation License allows to redistribute; see ``assets/heads/README.md``).
The benchmark and demo prompts are deliberately left out so measurements stay
held out. Rebuild with ``python -m engine.heads.corpus [OUT]``.
"""

import ast
import json
import re
import sys
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from engine.paths import ASSETS

DEFAULT = ASSETS / "heads" / "corpus.jsonl"
MODULES = (
    "argparse", "base64", "bisect", "calendar", "configparser", "contextlib", "copy", "csv",
    "dataclasses", "datetime", "difflib", "enum", "fnmatch", "fractions", "functools",
    "gettext", "glob", "graphlib", "gzip", "heapq", "hmac", "ipaddress", "json/__init__",
    "json/decoder", "json/encoder", "logging/__init__", "mimetypes", "numbers", "operator",
    "pathlib", "platform", "pprint", "queue", "random", "reprlib", "sched", "secrets",
    "shlex", "shutil", "statistics", "string", "tempfile", "textwrap", "threading",
    "tokenize", "urllib/parse", "uuid", "weakref", "zipfile", "zoneinfo/_zoneinfo",
)
MAX_CODE_CHARS = 1800
MIN_DOC_CHARS = 40
# a line with its end, as the parser counts lines: \r\n, \r or \n (not \f, \v, ...)
_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+\Z")


def _chat(user: str, assistant: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]


def first_line(doc: str) -> str:
    line = doc.strip().split("\n\n")[0].replace("\n", " ").strip().rstrip(".")
    return line[:1].lower() + line[1:]


@dataclass(frozen=True)
class Definition:
    """A public top-level function or class of a standard-library module."""

    name: str
    kind: str  # "function" or "class"
    code: str  # its source text
    doc: str  # its docstring ("" when it has none)


def module_sources() -> Iterator[tuple[str, str]]:
    """``(module, source text)`` of each of :data:`MODULES`, from this interpreter."""
    lib = Path(sysconfig.get_paths()["stdlib"])
    for module in MODULES:
        yield module, (lib / f"{module}.py").read_text(encoding="utf-8")


def source_lines(source: str) -> list[str]:
    """``source`` split into lines with their ends, as the parser numbers them."""
    return _LINE.findall(source)


def segment(lines: list[str], node: ast.stmt) -> str:
    """The source text of ``node`` (what ``ast.get_source_segment`` returns), from the
    lines of :func:`source_lines`, split once per module: ``get_source_segment`` splits the
    whole source again for every node. Column offsets count UTF-8 bytes."""
    first, last = node.lineno - 1, (node.end_lineno or node.lineno) - 1
    start, end = node.col_offset, node.end_col_offset
    if first == last:
        return lines[first].encode()[start:end].decode()
    return "".join([lines[first].encode()[start:].decode(), *lines[first + 1:last],
                    lines[last].encode()[:end].decode()])


def definitions(tree: ast.Module, source: str) -> Iterator[Definition]:
    """The public top-level functions and classes of a parsed module, in source order."""
    lines = source_lines(source)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef) and not node.name.startswith("_"):
            kind = "class" if isinstance(node, ast.ClassDef) else "function"
            yield Definition(node.name, kind, segment(lines, node), ast.get_docstring(node) or "")


def records(module: str, source: str, tree: ast.Module | None = None
            ) -> Iterator[list[dict[str, str]]]:
    """Chat records for one module's source text (``tree``: its parse, if at hand)."""
    tree = ast.parse(source) if tree is None else tree
    name = module.removesuffix("/__init__").replace("/", ".")
    doc = ast.get_docstring(tree)
    if doc and len(doc) >= MIN_DOC_CHARS:
        yield _chat(f"What does the Python module {name} do?", doc.strip())
    for d in definitions(tree, source):
        if len(d.doc) < MIN_DOC_CHARS:
            continue
        if len(d.code) <= MAX_CODE_CHARS:
            ask = f"Write a Python {d.kind} `{d.name}` that {first_line(d.doc)}."
            yield _chat(ask, f"Here is the {d.kind}:\n\n```python\n{d.code}\n```")
        yield _chat(f"Explain what `{name}.{d.name}` does.", d.doc.strip())


def build(out: Path = DEFAULT) -> int:
    """Write the corpus from this interpreter's standard library; return the record count."""
    found: list[list[dict[str, str]]] = []
    for module, source in module_sources():
        found.extend(records(module, source))
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as f:
        for messages in found:
            f.write(json.dumps({"messages": messages}, ensure_ascii=False) + "\n")
    return len(found)


def load(path: Path = DEFAULT) -> list[list[dict[str, str]]]:
    """The conversations of a corpus file."""
    with path.open(encoding="utf-8") as f:
        return [json.loads(line)["messages"] for line in f if line.strip()]


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT
    sys.stderr.write(f"{build(target)} conversations written to {target}\n")
