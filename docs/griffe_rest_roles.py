"""A Griffe extension: the reST bits of threadline's docstrings, as Markdown for the site.

The docstrings are written for ``help()`` and editors, with Sphinx roles
(``:class:`~threadline._store.ConversationStore```) and ``::`` literal blocks.
mkdocstrings reads Markdown, so before rendering this rewrites, in the text
it is given only (the source files are not touched):

- a role naming a public object to a link to its page in the API reference,
  under the name users import it by (``threadline.stores.ConversationStore``,
  never the private module that defines it); any other role to inline code;
- a mention of a guide page (``docs/limiting.md``) to a link to that page;
- the first paragraph to one line, the summary the reference's tables show;
- a paragraph ending in ``::`` followed by an indented block to a fenced code
  block (Python when it parses as Python, plain text otherwise), and a lone
  ``Example::`` to Google's ``Example:`` section.
"""

from __future__ import annotations

import ast
import re
import textwrap
from pathlib import Path
from typing import Any

import griffe

# The packages whose ``__all__`` is the public face, documented in docs/reference/.
# The top-level package comes last: a name it re-exports is documented as threadline.X,
# which is also what its ``__module__`` says.
PUBLIC_PACKAGES = (
    "threadline.limiting",
    "threadline.counting",
    "threadline.tools",
    "threadline.drivers",
    "threadline.stores",
    "threadline.serialization",
    "threadline.testing",
    "threadline",
)

ROLE = re.compile(r":(?:class|mod|func|meth|attr|exc|data|obj|const):`(~?)([\w.]+)`")
GUIDE_PAGE = re.compile(r"(?<![\w/`])docs/(\w+)\.md\b")
DOCS = Path(__file__).parent
SECTION = re.compile(r"^\w[\w ]*:\s*$")
LITERAL = re.compile(r"^(?P<indent>[ ]*)(?P<text>\S.*?)::[ ]*$")


def join_summary(text: str) -> str:
    """Put the first paragraph on one line: the reference's tables show the first line."""
    lines = text.splitlines()
    end = 0
    while end < len(lines) and lines[end].strip() and not SECTION.match(lines[end]):
        end += 1
    if end <= 1:
        return text
    return "\n".join([" ".join(line.strip() for line in lines[:end]), *lines[end:]])


def _guide_link(match: re.Match[str]) -> str:
    # Links resolve from the reference page, docs/reference/NAME.md.
    page = match[1]
    if not (DOCS / f"{page}.md").is_file():
        return match[0]
    return f"[{match[0]}](../{page}.md)"


def _python(code: str) -> bool:
    try:
        compile(code, "<docstring>", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    except SyntaxError:
        return False
    return True


def fence_literal_blocks(text: str) -> str:
    """Turn every ``Paragraph::`` plus indented block into a fenced code block."""
    lines = text.splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        match = LITERAL.match(lines[i])
        if match is None:
            out.append(lines[i])
            i += 1
            continue
        indent = len(match["indent"])
        j = i + 1
        while j < len(lines) and not lines[j].strip():
            j += 1
        end = j
        while end < len(lines) and (
            not lines[end].strip() or len(lines[end]) - len(lines[end].lstrip()) > indent
        ):
            end += 1
        while end > j and not lines[end - 1].strip():
            end -= 1
        if end == j:  # no indented block follows: leave the line alone
            out.append(lines[i])
            i += 1
            continue
        code = textwrap.dedent("\n".join(lines[j:end]))
        language = "python" if _python(code) else "text"
        pad = " " * indent
        if match["text"] in ("Example", "Examples"):
            # Google's section: its body is the fenced block, indented under the title.
            body = " " * (indent + 4)
            out.append(f"{pad}{match['text']}:")
        else:
            body = pad
            out += [f"{pad}{match['text']}:", ""]
        out.append(f"{body}```{language}")
        out += [f"{body}{line}" if line else "" for line in code.splitlines()]
        out.append(f"{body}```")
        out.append("")
        i = end
    return "\n".join(out)


class RestRoles(griffe.Extension):
    """Rewrite reST roles and literal blocks in threadline's docstrings as Markdown."""

    def __init__(self) -> None:
        self._public: dict[str, str] = {}

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        if pkg.path != "threadline":
            return
        self._public = self._public_paths(loader)
        self._rewrite(pkg, loader)

    @staticmethod
    def _public_paths(loader: griffe.GriffeLoader) -> dict[str, str]:
        """Where each public object is defined -> the path it is documented under."""
        public: dict[str, str] = {}
        for package_path in PUBLIC_PACKAGES:
            package = loader.modules_collection[package_path]
            public[package_path] = package_path
            for name in package.exports or ():
                name = str(name)
                member = package.members.get(name)
                if member is None:
                    # A lazy name (module __getattr__) that Griffe cannot see would be
                    # missing from the reference without a word: a warning fails --strict.
                    if not name.startswith("_"):
                        griffe.logger.warning(
                            "%s.__all__ names %r, which the API reference cannot find; "
                            "import it under `if TYPE_CHECKING:` in %s",
                            package_path,
                            name,
                            package.filepath,
                        )
                    continue
                try:
                    defined = member.final_target.path if member.is_alias else member.path
                except (griffe.AliasResolutionError, griffe.CyclicAliasError):
                    continue
                public[defined] = f"{package_path}.{name}"
        return public

    def _rewrite(self, obj: griffe.Object, loader: griffe.GriffeLoader) -> None:
        if obj.docstring is not None:
            value = fence_literal_blocks(join_summary(obj.docstring.value))
            value = ROLE.sub(lambda m: self._role(m, obj, loader), value)
            obj.docstring.value = GUIDE_PAGE.sub(_guide_link, value)
        for member in obj.members.values():
            if not member.is_alias:
                self._rewrite(member, loader)  # type: ignore[arg-type]

    def _role(
        self, match: re.Match[str], context: griffe.Object, loader: griffe.GriffeLoader
    ) -> str:
        short, target = match[1], match[2]
        shown = target.rsplit(".", 1)[-1] if short else target
        public = self._public_path(target, context, loader)
        return f"[`{shown}`][{public}]" if public else f"`{shown}`"

    def _public_path(
        self, target: str, context: griffe.Object, loader: griffe.GriffeLoader
    ) -> str | None:
        # A bare or partial name (``:meth:`load```) is looked up from the
        # docstring's own object outwards, as Sphinx does.
        scopes: list[griffe.Object] = [context]
        while scopes[-1].parent is not None:
            scopes.append(scopes[-1].parent)
        candidates = [target, *(f"{scope.path}.{target}" for scope in scopes)]
        for candidate in candidates:
            try:
                found = loader.modules_collection[candidate]
            except KeyError:
                continue
            try:
                path = found.final_target.path if found.is_alias else found.path
            except (griffe.AliasResolutionError, griffe.CyclicAliasError):
                continue
            return self._documented(path)
        return None

    def _documented(self, path: str) -> str | None:
        """The public path of ``path`` or of the member of a public object it names."""
        head, rest = path, ""
        while head:
            if head in self._public:
                if any(part.startswith("_") for part in rest.split(".") if part):
                    return None
                return self._public[head] + rest
            if "." not in head:
                return None
            head, tail = head.rsplit(".", 1)
            rest = f".{tail}{rest}"
        return None
