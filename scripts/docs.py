"""The documentation site's build step: a MkDocs hook (``mkdocs.yml`` names this file under ``hooks``).

Most of what the site says already lives in the repository: README.md, runtimes/README.md, the event dispatcher's
README, playbooks/README.md, the OpenAPI document, the CLI's argparse parser. Copies of those would drift, so the
pages under ``docs/`` hold short prose and include directives, and the references are made from the code. Both
happen at build time, in memory: nothing generated is written into ``docs/`` or committed.

An include directive is a line of its own in a page::

    <!-- include README.md section="Scaling" -->

Options (shell quoting): ``section="Heading"`` takes that heading's body (its own heading line dropped, deeper
headings raised to fit under the page's title); without it the whole file. ``item="Prefix"`` (repeatable) keeps only
the section's top-level list items whose text starts so (``**`` ignored); ``rest`` keeps the section with the items
that other pages include left out, so a new item shows up somewhere without editing the site; ``lead`` keeps only
the text before the first sub-heading; ``notitle`` drops a whole file's ``#`` title. A directive whose section or
item is not found stops the build: the site must not silently lose what a README renamed.

Links inside included text are written for the repository (``runtimes/README.md#streaming``,
``#install-on-a-cluster``); they are pointed at the page that includes their target, and a link to a repository file
that no page includes becomes its path in code, so ``mkdocs build --strict`` finds no broken link.

``python scripts/docs.py [--out DIR]`` writes the generated reference pages to DIR (default: print the list), to
read them without a build.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import posixpath
import re
import shlex
import sys
import unicodedata
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mkdocs.config.defaults import MkDocsConfig
    from mkdocs.structure.files import Files
    from mkdocs.structure.pages import Page

ROOT = Path(__file__).resolve().parents[1]
DIRECTIVE = re.compile(r"^<!-- include (?P<args>.+?) -->$", re.MULTILINE)
HEADING = re.compile(r"^(#{1,6}) +(.+?) *#*$")
FENCE = re.compile(r"^ {0,3}(```|~~~)")
LINK = re.compile(r"(?<!!)\[(?P<text>[^\]\n]*)\]\((?P<target>[^)\s]+)\)")
BLOCK_START = re.compile(r"^(?:[-*+] |\d+\. |\|)")


# --- reading Markdown sources ------------------------------------------------------------------------------------


def unfenced(lines: list[str]) -> Iterator[tuple[int, str, bool]]:
    """Each line with whether it is outside a code fence: a ``# comment`` in a shell example is no heading."""
    fenced = False
    for number, line in enumerate(lines):
        if FENCE.match(line):
            fenced = not fenced
            yield number, line, False
            continue
        yield number, line, not fenced


def headings(text: str) -> list[tuple[int, int, str]]:
    """(line number, level, text) of every heading outside code fences."""
    found = []
    for number, line, outside in unfenced(text.splitlines()):
        match = HEADING.match(line) if outside else None
        if match:
            found.append((number, len(match.group(1)), match.group(2)))
    return found


def plain(heading: str) -> str:
    """A heading's text as a reader sees it: no code ticks, emphasis or link syntax."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    return text.replace("`", "").replace("**", "").replace("*", "")


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: the spelling of the links written in the repository's READMEs."""
    text = plain(heading).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def site_slug(heading: str) -> str:
    """The anchor MkDocs (Python-Markdown's toc extension) gives the same heading on the site."""
    text = unicodedata.normalize("NFKD", plain(heading)).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


class IncludeError(Exception):
    """A directive names a section or item that is not there (any more): the build must stop, not drop it."""


@dataclass(frozen=True)
class Include:
    """One include directive, as written in a page."""

    page: str  # the page's path under docs/
    source: str  # the included file's path in the repository
    section: str | None = None
    items: tuple[str, ...] = ()
    rest: bool = False
    lead: bool = False
    notitle: bool = False

    @classmethod
    def parse(cls, page: str, args: str) -> Include:
        words = shlex.split(args)
        source, options = words[0], words[1:]
        section: str | None = None
        items: list[str] = []
        flags: set[str] = set()
        for option in options:
            key, _, value = option.partition("=")
            if key == "section":
                section = value
            elif key == "item":
                items.append(value)
            elif key in ("rest", "lead", "notitle") and not value:
                flags.add(key)
            else:
                raise IncludeError(f"{page}: unknown include option {option!r}")
        if not (ROOT / source).is_file():
            raise IncludeError(f"{page}: {source} is not a file of the repository")
        return cls(page, source, section, tuple(items), "rest" in flags, "lead" in flags, "notitle" in flags)


def section_lines(text: str, title: str, source: str) -> tuple[int, list[str]]:
    """The level of heading TITLE and the lines of its body, up to the next heading of that level or above."""
    lines = text.splitlines()
    found = headings(text)
    for index, (number, level, heading) in enumerate(found):
        if plain(heading) == plain(title):
            end = next((n for n, lvl, _ in found[index + 1:] if lvl <= level), len(lines))
            return level, lines[number + 1:end]
    raise IncludeError(f"{source} has no heading {title!r}")


def split_items(lines: list[str]) -> list[tuple[str | None, list[str]]]:
    """The lines as blocks: each top-level list item (``- ...`` and its indented continuation) is one, with its
    text; everything between items is a block without one."""
    blocks: list[tuple[str | None, list[str]]] = []
    current: tuple[str | None, list[str]] = (None, [])
    for line in lines:
        if line.startswith("- "):
            if current[1]:
                blocks.append(current)
            current = (line[2:].replace("**", ""), [line])
        elif current[0] is not None and line and not line[0].isspace():
            blocks.append(current)
            current = (None, [line])
        else:
            current[1].append(line)
    if current[1]:
        blocks.append(current)
    return blocks


def matching(blocks: list[tuple[str | None, list[str]]], prefix: str, where: str) -> int:
    hits = [i for i, (text, _) in enumerate(blocks) if text is not None and text.startswith(prefix)]
    if len(hits) != 1:
        raise IncludeError(f"{where}: {len(hits)} list items start with {prefix!r} (want exactly one)")
    return hits[0]


def shift_headings(lines: list[str], by: int) -> list[str]:
    """Raise (BY > 0) every heading outside code fences by BY levels, never above ``##`` (the page owns ``#``)."""
    out = []
    for _, line, outside in unfenced(lines):
        match = HEADING.match(line) if outside else None
        if match and by:
            out.append("#" * max(2, len(match.group(1)) - by) + " " + match.group(2))
        else:
            out.append(line)
    return out


def tidy(lines: list[str]) -> list[str]:
    """What GitHub renders and Python-Markdown does not: a list or table right under a paragraph line needs a
    blank line first, and ``\\|`` inside a code span of a table cell (GitHub's escape) is a plain ``|`` there."""
    out: list[str] = []
    for _, line, outside in unfenced(lines):
        if outside and BLOCK_START.match(line) and out and out[-1].strip() and not BLOCK_START.match(out[-1]) \
                and not out[-1][0].isspace():
            out.append("")
        if outside and line.startswith("|"):
            out.append(re.sub(r"`[^`]*`", lambda m: m.group(0).replace("\\|", "|"), line))
        else:
            out.append(line)
    return out


# --- the site: which page includes what, and the links between them ----------------------------------------------


@dataclass
class Site:
    """What every page includes, read before any page is rendered, so links and ``rest`` can see all of it."""

    includes: dict[str, list[Include]] = field(default_factory=dict)
    #: (repository file, GitHub anchor or "") -> (page, anchor on the site or "")
    targets: dict[tuple[str, str], tuple[str, str]] = field(default_factory=dict)

    def read(self, pages: dict[str, str]) -> None:
        self.includes.clear()
        self.targets.clear()
        for page, text in sorted(pages.items()):
            self.includes[page] = [Include.parse(page, m.group("args")) for m in DIRECTIVE.finditer(text)]
        for page, includes in self.includes.items():
            for inc in includes:
                if inc.items:
                    continue  # single list items carry no heading to link to
                text = (ROOT / inc.source).read_text()
                if inc.section is None:
                    self.targets.setdefault((inc.source, ""), (page, ""))
                    for _, _, heading in headings(text):
                        self.targets.setdefault((inc.source, github_slug(heading)), (page, site_slug(heading)))
                    continue
                self.targets.setdefault((inc.source, github_slug(inc.section)), (page, ""))
                _, body = section_lines(text, inc.section, inc.source)
                if inc.lead:
                    continue  # the text before the first sub-heading: no heading in it
                for _, _, heading in headings("\n".join(body)):
                    self.targets.setdefault((inc.source, github_slug(heading)), (page, site_slug(heading)))
        # A file included only in parts links to the first page that includes it, the home page first.
        for page in sorted(self.includes, key=lambda p: (p != "index.md", p)):
            for inc in self.includes[page]:
                self.targets.setdefault((inc.source, ""), (page, ""))

    def taken_elsewhere(self, inc: Include) -> list[str]:
        return [prefix for page, includes in self.includes.items() if page != inc.page for other in includes
                if other.source == inc.source and other.section == inc.section for prefix in other.items]

    def expand(self, inc: Include) -> str:
        text = (ROOT / inc.source).read_text()
        where = f"{inc.page}: {inc.source}" + (f" section {inc.section!r}" if inc.section else "")
        if inc.section is None:
            lines = text.splitlines()
            if inc.notitle and lines and lines[0].startswith("# "):
                lines = lines[1:]
            level = 0
        else:
            level, lines = section_lines(text, inc.section, inc.source)
        if inc.lead:
            first = next((n for n, _, heading in headings("\n".join(lines))), len(lines))
            lines = lines[:first]
        if inc.items or inc.rest:
            blocks = split_items(lines)
            if inc.items:
                chosen = [matching(blocks, prefix, where) for prefix in inc.items]
                lines = [line for i in chosen for line in [*blocks[i][1], ""]]
            else:
                dropped = {matching(blocks, prefix, where) for prefix in self.taken_elsewhere(inc)}
                lines = [line for i, (_, block) in enumerate(blocks) if i not in dropped for line in block]
        lines = shift_headings(lines, level - 1 if level > 1 else 0)
        return self.relink("\n".join(tidy(lines)).strip("\n"), inc.source, inc.page)

    def relink(self, text: str, source: str, page: str) -> str:
        """Point each repository-relative link of SOURCE's text at the site's page for it (seen from PAGE)."""

        def one(match: re.Match[str]) -> str:
            label, target = match.group("text"), match.group("target")
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:: left as they are
                return match.group(0)
            path, _, anchor = target.partition("#")
            repo_path = posixpath.normpath(posixpath.join(posixpath.dirname(source), path)) if path else source
            where = self.targets.get((repo_path, anchor)) or (self.targets.get((repo_path, "")) if not anchor
                                                              else None)
            if where is None and anchor:  # an anchor no page has: the page of the file at least
                where = self.targets.get((repo_path, ""))
                if where is not None:
                    where = (where[0], "")
            if where is None:
                shown = label.strip("`")
                return f"`{repo_path}`" if shown == repo_path else f"{label} (`{repo_path}` in the repository)"
            target_page, target_anchor = where
            href = posixpath.relpath(target_page, posixpath.dirname(page) or ".") if target_page != page else ""
            if target_anchor:
                href += "#" + target_anchor
            return f"[{label}]({href or '#'})"

        out = []
        for _, line, outside in unfenced(text.splitlines()):
            out.append(LINK.sub(one, line) if outside else line)
        return "\n".join(out)

    def render(self, page: str, markdown: str) -> str:
        includes = iter(self.includes.get(page, []))
        return DIRECTIVE.sub(lambda _: self.expand(next(includes)), markdown)


# --- generated references -------------------------------------------------------------------------------------


def cell(text: object) -> str:
    """A value as one Markdown table cell: one line, pipes escaped outside code spans (Python-Markdown splits no
    cell inside one, and would show the backslash there)."""
    parts = re.split(r"(`+[^`]*`+)", " ".join(str(text).split()))
    return "".join(part if part.startswith("`") else part.replace("|", "\\|") for part in parts) or " "


def code(text: str) -> str:
    return f"`` {text} ``" if "`" in text else f"`{text}`"


def schema_text(schema: dict[str, Any]) -> str:
    """A schema in a few words: a named schema as a link to its entry below, else its type and bounds."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{site_slug(name)})"
    for key in ("anyOf", "oneOf", "allOf"):
        if key in schema:
            joiner = " and " if key == "allOf" else " or "
            return joiner.join(schema_text(part) for part in schema[key])
    if "const" in schema:
        return code(repr(schema["const"]).replace("'", '"'))
    if "enum" in schema:
        return "one of " + ", ".join(code(str(v)) for v in schema["enum"])
    kind = schema.get("type", "any")
    if isinstance(kind, list):
        kind = " or ".join(kind)
    if kind == "array":
        kind = "array of " + schema_text(schema.get("items", {}))
    bounds = []
    for key, shown in (("minimum", ">="), ("maximum", "<="), ("minLength", "length >="), ("maxLength", "length <="),
                       ("minItems", "items >="), ("maxItems", "items <=")):
        if key in schema:
            bounds.append(f"{shown} {schema[key]}")
    if "pattern" in schema:
        bounds.append("pattern " + code(schema["pattern"]))
    if "format" in schema:
        bounds.append(f"format {schema['format']}")
    return str(kind) + (f" ({', '.join(bounds)})" if bounds else "")


def parameters_table(parameters: list[dict[str, Any]]) -> list[str]:
    rows = ["| name | in | required | schema | description |", "|---|---|---|---|---|"]
    for p in parameters:
        rows.append(f"| {code(p['name'])} | {p['in']} | {'yes' if p.get('required') else 'no'} | "
                    f"{cell(schema_text(p.get('schema', {})))} | {cell(p.get('description', ''))} |")
    return rows


def body_text(content: dict[str, Any]) -> str:
    """A request or response body: each media type with its schema."""
    parts = []
    for media, spec in content.items():
        schema = spec.get("schema")
        parts.append(f"{code(media)}: {schema_text(schema)}" if schema else code(media))
    return "; ".join(parts)


def api_reference() -> str:
    """The REST API reference, from the OpenAPI document the API serves at /v1/openapi.json."""
    from sless_api.rest.openapi import document

    doc = document()
    components = doc.get("components", {})
    shared = components.get("responses", {})
    out = [f"# {doc['info']['title']}", "",
           "Made from the OpenAPI document the API serves at `GET /v1/openapi.json` (OpenAPI "
           f"{doc['openapi']}, API version {doc['info']['version']}), when this site was built. "
           "What the routes do is told in the [REST API overview](rest.md).", "",
           doc["info"].get("description", ""), ""]
    schemes = components.get("securitySchemes", {})
    if schemes:
        out += ["Security schemes: " + "; ".join(
            f"{code(name)} ({s.get('scheme', s.get('type'))}{', ' + s['description'] if 'description' in s else ''})"
            for name, s in schemes.items()) + ".", ""]
    out += ["| path | methods |", "|---|---|"]
    methods_of = {path: [m for m in item if m not in ("parameters", "summary", "description")]
                  for path, item in doc["paths"].items()}
    for path, methods in methods_of.items():
        out.append(f"| [{cell(path)}](#{site_slug(path)}) | {', '.join(m.upper() for m in methods)} |")
    out.append("")
    for path, item in doc["paths"].items():
        out += [f"## {path}", ""]
        if item.get("parameters"):
            out += ["Parameters of every method:", "", *parameters_table(item["parameters"]), ""]
        for method in methods_of[path]:
            op = item[method]
            out += [f"### {method.upper()} {path}", "", op.get("summary", "").capitalize() + ".", ""]
            if op.get("description"):
                out += [op["description"], ""]
            if "security" in op:
                needs = [", ".join(req) or "none" for req in op["security"]]
                out += ["Authentication: " + (" or ".join(needs) if needs else "none") + ".", ""]
            if op.get("parameters"):
                out += ["Parameters:", "", *parameters_table(op["parameters"]), ""]
            body = op.get("requestBody")
            if body:
                out += [f"Request body{' (required)' if body.get('required') else ''}: "
                        f"{body_text(body.get('content', {}))}.", ""]
            out += ["| status | meaning | body |", "|---|---|---|"]
            answers = op.get("responses", {})
            for status, given in sorted(answers.items(), key=lambda kv: (kv[0] == "default", kv[0])):
                answer = shared[given["$ref"].rsplit("/", 1)[-1]] if "$ref" in given else given
                out.append(f"| {status} | {cell(answer.get('description', ''))} | "
                           f"{cell(body_text(answer.get('content', {})))} |")
            out.append("")
    out += ["## Schemas", ""]
    for name, schema in components.get("schemas", {}).items():
        out += [f"### {name}", ""]
        if schema.get("description"):
            out += [schema["description"], ""]
        properties = schema.get("properties")
        if not properties:
            out += [f"{schema_text(schema)}.", ""]
            continue
        required = set(schema.get("required", []))
        out += ["| field | required | schema | description |", "|---|---|---|---|"]
        for prop, spec in properties.items():
            out.append(f"| {code(prop)} | {'yes' if prop in required else 'no'} | {cell(schema_text(spec))} | "
                       f"{cell(spec.get('description', ''))} |")
        extra = schema.get("additionalProperties")
        out += ["", "Other fields are refused." if extra is False else "", ""]
    return "\n".join(out)


def cli_parser() -> argparse.ArgumentParser:
    """The ``sless`` command's parser, built as its entry point builds it (``main.sless``), with a fixed
    environment so the page does not depend on who builds the site."""
    from sless_api.cli import commands
    from sless_api.main import up

    return commands.parser(commands.ClientEnv.from_env({}), extra=[up.register])


def subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, str, argparse.ArgumentParser]]:
    """(name, one-line help, parser) of each sub-command, in the order ``--help`` lists them."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            for name, sub in action.choices.items():
                found.append((name, helps.get(name, ""), sub))
    return found


def help_text(parser: argparse.ArgumentParser) -> str:
    """``--help`` as a terminal 100 columns wide shows it, whatever the builder's terminal is."""
    with _columns(100):
        return parser.format_help().rstrip()


@contextlib.contextmanager
def _columns(width: int) -> Iterator[None]:
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(width)
    try:
        yield
    finally:
        if old is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = old


def cli_reference() -> str:
    """The CLI reference: ``sless --help`` and every verb's (and sub-verb's) ``--help``."""
    root = cli_parser()
    verbs = subcommands(root)
    out = ["# sless command line", "",
           "Each verb's `--help`, as this version of `sless` prints it (made from the command's own parser when "
           "this site was built). The verbs and their output are told in [Getting started](../getting-started.md).",
           "", "| verb | what |", "|---|---|"]
    out += [f"| [`sless {name}`](#{site_slug('sless ' + name)}) | {cell(text)} |" for name, text, _ in verbs]
    out += ["", "## sless", "", "```text", help_text(root), "```", ""]
    for name, _, parser in verbs:
        out += [f"## sless {name}", "", "```text", help_text(parser), "```", ""]
        for sub_name, _, sub in subcommands(parser):
            out += [f"### sless {name} {sub_name}", "", "```text", help_text(sub), "```", ""]
    return "\n".join(out)


#: Pages made at build time: path under docs/ -> what writes it.
GENERATED: dict[str, Callable[[], str]] = {
    "reference/api.md": api_reference,
    "reference/cli.md": cli_reference,
}


# --- MkDocs hooks -------------------------------------------------------------------------------------------------

SITE = Site()


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """Add the generated pages, then read every page's include directives (links need all of them first)."""
    from mkdocs.structure.files import File

    for path, make in GENERATED.items():
        if files.get_file_from_path(path) is not None:
            raise IncludeError(f"docs/{path} is generated at build time: remove the committed copy")
        files.append(File.generated(config, path, content=make()))
    pages = {f.src_uri: Path(f.abs_src_path).read_text() for f in files.documentation_pages()
             if f.abs_src_path and f.src_uri not in GENERATED}
    SITE.read(pages)
    return files


def on_page_markdown(markdown: str, page: Page, config: MkDocsConfig, files: Files) -> str:
    """Replace the page's include directives with what they name."""
    return SITE.render(page.file.src_uri, markdown)


# --- command line -----------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """Write the generated pages to a folder (or list them), to read them without building the site."""
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    cli.add_argument("--out", type=Path, help="folder to write the generated pages into")
    args = cli.parse_args(argv)
    for path, make in GENERATED.items():
        if args.out is None:
            print(path)
            continue
        target = args.out / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(make())
    return 0


if __name__ == "__main__":
    sys.exit(main())
