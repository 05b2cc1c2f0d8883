"""The documentation site (``docs/``, MkDocs): it builds with no broken link or missing page, and
every example that shows what it prints still prints that (``tests/docs_check.py``)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, clean_env

DOCS = ROOT / "docs"
PAGES = sorted(p.name for p in DOCS.glob("*.md"))
CHECK = Path(__file__).with_name("docs_check.py")


def _live_pages() -> list[str]:
    return [p for p in PAGES if "```output" in (DOCS / p).read_text()]


def test_every_page_is_in_the_navigation():
    nav = (ROOT / "mkdocs.yml").read_text()
    assert [p for p in PAGES if p not in nav] == []


def test_output_blocks_follow_a_python_block():
    # an output block is a claim the tests check: it must belong to the python block before it
    for page in PAGES:
        fences = re.findall(r"^```(\S*)$", (DOCS / page).read_text(), re.MULTILINE)
        opening = fences[0::2]          # fences alternate: opening (with language), closing
        for before, lang in zip(opening, opening[1:]):
            if lang == "output":
                assert before == "python", f"{page}: an output block follows a {before!r} block"


# pages whose examples show what a widening host does (kept fp32 forms, released bytes): run
# them so on every host, hosts with native fp16 GEMMs (AVX512-FP16, AMX) included
PAGE_ENV = {"tensors-and-memory.md": {"TORCH_RBLN_MATMUL_PRECISION": "widen"}}


@pytest.mark.parametrize("page", _live_pages())
def test_page_examples_print_what_the_page_shows(page):
    # a fresh process per page: what it reports is what a user running the page as a script sees
    r = subprocess.run([sys.executable, str(CHECK), str(DOCS / page)], capture_output=True,
                       text=True, cwd=ROOT, env=clean_env(PAGE_ENV.get(page)), timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr


def test_mkdocs_build_strict(tmp_path):
    env = clean_env({"NO_MKDOCS_2_WARNING": "1"})
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                        str(tmp_path / "site")], capture_output=True, text=True, cwd=ROOT,
                       env=env, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (tmp_path / "site" / "api-reference" / "index.html").exists()
