"""The documentation site builds with warnings as errors, and its references cover what the code has.

``mkdocs build --strict`` fails on a broken link or anchor, a page missing from the nav and an include directive
whose README section or item is gone (scripts/docs.py raises). On top of that the built pages are checked against
their sources: every OpenAPI path, every verb of ``sless --help``, every setting of the README's tables, and no
script or stylesheet from outside (the site must work offline).
"""

from __future__ import annotations

import html
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from sless_api.rest.openapi import document

ROOT = Path(__file__).resolve().parents[2]
SETTING = re.compile(r"\b(?:SLESS_[A-Z0-9_]+|KUBECONFIG|PROMETHEUS_MULTIPROC_DIR)\b")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("docs") / "site"
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                           str(ROOT / "mkdocs.yml"), "--site-dir", str(out)],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout}\n{done.stderr}"
    assert "WARNING" not in done.stderr, done.stderr
    return out


def page_text(site: Path, page: str) -> str:
    return html.unescape((site / page).read_text())


def test_every_openapi_path_has_its_section(site: Path) -> None:
    text = page_text(site, "reference/api.html")
    missing = [path for path in document()["paths"] if f">{path}<" not in text]
    assert not missing, f"the API reference lacks {missing}"


def test_every_verb_of_sless_help_has_its_section(site: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "sless_api.main.sless", "--help"], capture_output=True, text=True,
                          timeout=60, check=True, env={**os.environ, "COLUMNS": "200"})
    listed = re.search(r"^\s+\{([a-z0-9,-]+)\}", done.stdout, re.MULTILINE)
    assert listed, done.stdout
    verbs = listed.group(1).split(",")
    assert {"up", "deploy", "invoke", "logs"} <= set(verbs)
    text = page_text(site, "reference/cli.html")
    missing = [verb for verb in verbs if f">sless {verb}<" not in text]
    assert not missing, f"the CLI reference lacks {missing}"


def readme_settings() -> set[str]:
    """Every name in the first column of a table row of the README's Configuration section (as
    tests/unit/test_config_table.py reads it)."""
    section = (ROOT / "README.md").read_text().split("\n## Configuration\n", 1)[1].split("\n## ", 1)[0]
    return {name for line in section.splitlines() if line.startswith("| `")
            for name in SETTING.findall(line.split("|")[1])}


def test_the_settings_page_names_every_setting(site: Path) -> None:
    names = readme_settings()
    assert len(names) > 50
    text = page_text(site, "reference/settings.html")
    missing = sorted(name for name in names if f"<code>{name}</code>" not in text)
    assert not missing, f"the settings page lacks {missing}"


def test_the_event_envelope_and_runtime_contract_are_on_the_site(site: Path) -> None:
    events = page_text(site, "events.html")
    assert "The event a function receives" in events
    runtimes = page_text(site, "runtimes.html")
    assert "Environment variables" in runtimes and "One-shot runner" in runtimes


def test_no_page_loads_anything_from_outside(site: Path) -> None:
    outside = re.compile(r"<(?:script|link|img|iframe)\b[^>]*\b(?:src|href)=\"(?:https?:)?//", re.IGNORECASE)
    loading = {str(page.relative_to(site)) for page in site.rglob("*.html") if outside.search(page.read_text())}
    assert not loading, f"pages loading remote scripts or styles: {sorted(loading)}"
    assert (site / "index.html").is_file() and (site / "getting-started.html").is_file()


def docs_module() -> ModuleType:
    """scripts/docs.py, which is no package's module (MkDocs loads it by path, as this does)."""
    name = "sless_docs_hook"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts/docs.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up while being made
    spec.loader.exec_module(module)
    return module


def test_an_include_of_a_missing_section_or_item_stops_the_build() -> None:
    docs = docs_module()
    with pytest.raises(docs.IncludeError, match="No such heading"):
        docs.Site().read({"a.md": '<!-- include README.md section="No such heading" -->'})
    site = docs.Site()
    site.read({"a.md": '<!-- include README.md section="The REST API" item="No such item" -->'})
    with pytest.raises(docs.IncludeError, match="No such item"):
        site.render("a.md", '<!-- include README.md section="The REST API" item="No such item" -->')


def test_included_links_point_at_the_page_that_includes_their_target() -> None:
    docs = docs_module()
    site = docs.Site()
    site.read({"index.md": '<!-- include README.md section="sless" lead -->',
               "runtimes.md": "<!-- include runtimes/README.md notitle -->",
               "ops/install.md": '<!-- include README.md section="Install on a cluster" -->'})
    text = "[contract](runtimes/README.md#streaming), [install](#install-on-a-cluster), [cfg](noxfile.py)"
    assert site.relink(text, "README.md", "ops/other.md") == (
        "[contract](../runtimes.md#streaming), [install](install.md), cfg (`noxfile.py` in the repository)")
