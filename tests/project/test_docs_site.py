"""The documentation site builds from docs/ with `mkdocs build --strict`: a broken link,
a page missing from the nav, a click command or a docstring reference that no longer
resolves fails the build (mkdocs.yml; `make docs` serves the same site)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT

BUILD_TIMEOUT = 300


def test_docs_site_builds_strict(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs", reason="the docs extra is missing: pip install 'agentbus[docs]'")
    site = tmp_path / "site"
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet",
                           "--site-dir", str(site)], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=BUILD_TIMEOUT)
    assert done.returncode == 0, done.stderr
    cli = (site / "reference" / "cli" / "index.html").read_text()
    assert "bus channel send" in cli  # mkdocs-click walked the lazy root group
    api = (site / "reference" / "api" / "index.html").read_text()
    assert "process_loop" in api and "publish" in api  # mkdocstrings read the docstrings
    for guide in ("log", "channels", "pump", "coordination", "workers", "agents"):
        assert (site / guide / "index.html").exists(), guide


def test_every_docs_page_is_in_the_nav() -> None:
    nav = (REPO_ROOT / "mkdocs.yml").read_text()
    pages = {str(page.relative_to(REPO_ROOT / "docs")) for page in (REPO_ROOT / "docs").rglob("*.md")}
    assert sorted(page for page in pages if page not in nav) == []


def test_readme_links_stay_inside_the_repository() -> None:
    readme = (REPO_ROOT / "README.md").read_text()
    assert "../" not in readme
    for target in _links(readme):
        if "://" not in target:
            assert (REPO_ROOT / target.split("#", 1)[0]).exists(), target


def _links(markdown: str) -> list[str]:
    return re.findall(r"\]\(([^)\s]+)\)", markdown)
