"""Run one documentation page's live examples (``python tests/docs_check.py docs/PAGE.md``).

A page's examples are parsed with Sybil (``sybil`` in the test extra): every ```python block
that is followed by an ```output block is executed, in page order, in one namespace per page
(as one script), and what it prints must match the output block. In the expected output,
``...`` stands for any text (doctest's ELLIPSIS: numbers and timings that change between runs);
trailing spaces are ignored. ```python blocks without an output block are illustrations and do
not run; recorded outputs of heavy runs (torchrun, vLLM, 16-layer Llama) are ```text blocks
with the command and the date beside them.

Each page runs in a fresh process (``tests/test_docs.py``), so what it reports (compiles,
transfers, fallbacks) is what a user who runs the page as a script sees.
"""

from __future__ import annotations

import contextlib
import doctest
import io
import sys
import traceback
from pathlib import Path

import sybil
from sybil import Document, Region
from sybil.parsers.markdown.lexers import FencedCodeBlockLexer
from torch_rbln import user_frames

_ANY_BLOCK = FencedCodeBlockLexer(r"[\w-]*")


def _normalize(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.strip("\n").split("\n"))


def _matches(expected: str, got: str) -> bool:
    want, have = _normalize(expected), _normalize(got)
    return want == have or doctest._ellipsis_match(want, have)


class LiveExample:
    """A python block and the output block after it (``None``: no output claimed)."""

    def __init__(self, code: str, expected: str | None, line: int):
        self.code, self.expected, self.line = code, expected, line

    def __call__(self, example) -> str | None:
        name = Path(example.path).name
        # line numbers of the page, so tracebacks and explain's call sites point into it
        code = compile("\n" * (self.line - 1) + self.code, name, "exec")
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(code, example.namespace)
        if self.expected is not None and not _matches(self.expected, out.getvalue()):
            return (f"{name}:{self.line}: printed output differs\n--- expected\n"
                    f"{_normalize(self.expected)}\n--- printed\n{_normalize(out.getvalue())}")
        return None


def parse_live_examples(document: Document):
    """Sybil parser: one region per python block that has an output block right after it."""
    blocks = sorted(_ANY_BLOCK(document), key=lambda r: r.start)
    for block, after in zip(blocks, blocks[1:] + [None]):
        if block.lexemes["language"] != "python":
            continue
        if after is None or after.lexemes["language"] != "output" \
                or document.text[block.end:after.start].strip():
            continue
        line = document.text.count("\n", 0, block.start) + 2   # first line of the code
        yield Region(block.start, after.end,
                     LiveExample(str(block.lexemes["source"]), str(after.lexemes["source"]), line),
                     evaluator=lambda example: example.parsed(example))


def run_page(path: Path) -> int:
    # the examples' call sites name the page's lines, as a script's name its own
    user_frames.treat_as_library(__file__, str(Path(sybil.__file__).parent))
    document = Document.parse(str(path), parse_live_examples)
    document.namespace["__name__"] = "__main__"
    failures, count = 0, 0
    for example in document.examples():
        count += 1
        try:
            example.evaluate()
        except Exception as e:   # noqa: BLE001 - every failure is reported, the page goes on
            failures += 1
            detail = str(e) if type(e).__name__ == "SybilFailure" else traceback.format_exc()
            print(f"FAILED {path.name}:{example.line}\n{detail}", file=sys.stderr)
    print(f"{path.name}: {count} live examples, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(run_page(Path(sys.argv[1])))
