"""The training text: Python 3.11's own documentation, as Debian ships it.

Source: the reStructuredText sources (`_sources/**/*.rst.txt`) inside Debian 12's
`python3.11-doc` package (/usr/share/doc/python3.11/html/_sources). Licence: the Python
Software Foundation License Version 2 (PSF-2.0; see /usr/share/doc/python3.11-doc/copyright
and the docs' own license page); code examples in the docs are also under the Zero-Clause BSD
licence. A fresh Debian/Ubuntu machine installs it offline from its package mirror:

    apt-get install python3.11-doc
    # or, without installing: apt-get download python3.11-doc && dpkg-deb -x python3.11-doc_*.deb DIR

The markup is turned into plain text (roles, directives, labels, tables and heading rules
removed; code blocks kept, dedented), deterministically. Whole files are held out (the
SHA-1 of the file's path decides), so no held-out paragraph is ever seen in training.

Each file is one document. Its sections also become chat examples ("Tell me about
<heading>." answered by the section's first paragraphs) so that the model learns the chat
template; those are made from training files only.
"""

from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_DOCS = Path("/usr/share/doc/python3.11/html/_sources")

# Files whose text is mostly lists of names, changelog entries or license boilerplate.
SKIP = ("whatsnew/changelog", "license", "copyright", "bugs", "about", "contents",
        "genindex", "py-modindex", "search", "glossary")

HELD_OUT_MODULUS = 20  # one file in 20 (by path hash) is held out

# Directives whose body is dropped entirely (navigation, metadata, markup helpers).
DROP = {"index", "toctree", "sectionauthor", "moduleauthor", "highlight", "currentmodule",
        "include", "literalinclude", "tabularcolumns", "testsetup", "testcleanup", "only",
        "raw", "image", "figure", "productionlist", "list-table", "csv-table", "table",
        "availability", "audit-event", "audit-event-table", "impl-detail", "program",
        "default-role", "role", "c:namespace", "c:namespace-push", "c:namespace-pop",
        "limited-api-list", "miscnews", "rst-class", "cssclass", "centered", "hlist",
        "opcode", "pdbcommand", "index::", "moduleauthor::", "envvar", "cmdoption",
        "option", "2to3fixer", "setting", "unstable-api"}
# Directives whose argument is a signature, kept as a line of text before their body.
SIGNATURE = {"function", "method", "class", "data", "attribute", "exception", "decorator",
             "classmethod", "staticmethod", "coroutinefunction", "coroutinemethod",
             "abstractmethod", "describe", "decoratormethod", "module", "c:function",
             "c:type", "c:macro", "c:member", "c:var", "c:struct", "c:enum", "c:enumerator",
             "c:union", "attributetable", "awaitablefunction", "awaitablemethod"}
# Directives whose body is ordinary text, introduced by a word.
ADMONITION = {"note": "Note:", "warning": "Warning:", "seealso": "See also:",
              "important": "Important:", "tip": "Tip:", "caution": "Caution:",
              "attention": "Attention:", "hint": "Hint:", "danger": "Danger:",
              "admonition": "", "topic": "", "rubric": "", "sidebar": "", "epigraph": "",
              "versionadded": "New in version", "versionchanged": "Changed in version",
              "deprecated": "Deprecated since version", "deprecated-removed":
              "Deprecated since version", "container": ""}
CODE = {"code-block", "code", "sourcecode", "doctest", "testcode", "testoutput", "parsed-literal"}

DIRECTIVE = re.compile(r"^(\s*)\.\.\s+([\w:-]+)::\s*(.*)$")
EXPLICIT = re.compile(r"^(\s*)\.\.(\s|$)")
RULE = re.compile(r"^\s*([=\-~^\"'`#*+.:_])\1{2,}\s*$")
TABLE_RULE = re.compile(r"^\s*[+|][-=+|: ]*[+|]\s*$")
SIMPLE_TABLE_RULE = re.compile(r"^\s*=+( +=+)+\s*$")

ROLE = re.compile(r":[\w.:+-]+:`([^`]*)`")
NAMED_REF = re.compile(r"`([^`<]*?)\s*<[^`>]*>`__?")
REF = re.compile(r"`([^`]+)`__?")
LITERAL = re.compile(r"``(.+?)``")
STRONG = re.compile(r"\*\*(\S(?:.*?\S)?)\*\*")
EMPH = re.compile(r"(?<![\w*\\])\*(\S(?:[^*]*?\S)?)\*(?![\w*])")
SUBST = re.compile(r"\|([\w -]+)\|_?")
FOOTNOTE = re.compile(r"\s*\[(#\w*|\d+|\*)\]_")


def role_text(m: re.Match) -> str:
    t = m.group(1)
    # "title <target>" shows the title; "~a.b.c" shows "c"; "!x" shows "x".
    named = re.match(r"^(.*?)\s*<[^<>]*>$", t, re.S)
    if named and named.group(1):
        t = named.group(1)
    t = t.lstrip("!")
    if t.startswith("~"):
        t = t[1:].split(".")[-1]
    return t


def inline(s: str) -> str:
    s = FOOTNOTE.sub("", s)
    s = ROLE.sub(role_text, s)
    s = NAMED_REF.sub(lambda m: m.group(1), s)
    s = LITERAL.sub(lambda m: m.group(1), s)
    s = REF.sub(lambda m: m.group(1), s)
    s = STRONG.sub(lambda m: m.group(1), s)
    s = EMPH.sub(lambda m: m.group(1), s)
    s = SUBST.sub(lambda m: m.group(1), s)
    s = s.replace("\\ ", "").replace("\\*", "*").replace("\\`", "`").replace("\\\\", "\\")
    return s


def indent_of(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


@dataclass
class Section:
    title: str
    paragraphs: list[str] = field(default_factory=list)


def rst_to_text(src: str) -> tuple[str, list[Section]]:
    """Plain text of one rst file, and its sections (heading + paragraphs of prose)."""
    lines = src.expandtabs(8).splitlines()
    out: list[str] = []
    sections: list[Section] = [Section("")]
    para: list[str] = []

    def flush_para():
        if para:
            text = " ".join(p.strip() for p in para)
            sections[-1].paragraphs.append(text)
            para.clear()

    i, n = 0, len(lines)
    literal_next = False  # the previous paragraph ended with "::"
    while i < n:
        line = lines[i]
        stripped = line.strip()
        # Heading: text followed by a rule at least as long (with an optional overline).
        if (stripped and i + 1 < n and RULE.match(lines[i + 1])
                and len(lines[i + 1].strip()) >= len(stripped) and not RULE.match(line)):
            flush_para()
            title = inline(stripped)
            out.append("")
            out.append(title)
            out.append("")
            sections.append(Section(title))
            i += 2
            literal_next = False
            continue
        grid_row = len(stripped) > 2 and stripped[0] == "|" and stripped[-1] == "|"
        if RULE.match(line) or TABLE_RULE.match(line) or SIMPLE_TABLE_RULE.match(line) or grid_row:
            i += 1
            continue
        m = DIRECTIVE.match(line)
        if m or EXPLICIT.match(line):
            flush_para()
            base = indent_of(line)
            name = m.group(2) if m else ""
            arg = m.group(3).strip() if m else ""
            # The directive's body: following lines indented deeper than the "..", or blank.
            j = i + 1
            while j < n and (not lines[j].strip() or indent_of(lines[j]) > base):
                j += 1
            body = lines[i + 1: j]
            # Options (":maxdepth: 2") come first in the body.
            k = 0
            while k < len(body) and re.match(r"^\s*:[\w -]+:", body[k]):
                k += 1
            body = body[k:]
            if m and name in SIGNATURE:
                out.append("")
                out.append(inline(arg))
                lines[i + 1: j] = body  # the body is ordinary text: parse it in place
                n = len(lines)
                i += 1
                literal_next = False
                continue
            if m and name in ADMONITION:
                word = ADMONITION[name]
                head = " ".join(x for x in (word, inline(arg)) if x)
                if name in ("versionadded", "versionchanged", "deprecated", "deprecated-removed"):
                    head = head.split(",")[0] + ("." if not body or not "".join(body).strip() else ":")
                lines[i: j] = ([" " * base + head] if head else []) + body
                n = len(lines)
                literal_next = False
                continue
            if m and name in CODE:
                out.append("")
                out.extend(dedent_block(body))
                out.append("")
                i = j
                literal_next = False
                continue
            # Dropped: comments, labels, substitutions and DROP directives (and unknown ones).
            i = j
            continue
        if not stripped:
            flush_para()
            out.append("")
            i += 1
            continue
        if literal_next and indent_of(line) > 0:
            # A literal block: every following line indented deeper than the paragraph.
            j = i
            while j < n and (not lines[j].strip() or indent_of(lines[j]) > 0):
                j += 1
            out.extend(dedent_block(lines[i:j]))
            out.append("")
            i = j
            literal_next = False
            continue
        text = inline(stripped)
        if text.startswith("| "):  # line blocks
            text = text[2:]
        literal_next = stripped.endswith("::")
        if literal_next:
            text = text[:-2].rstrip()
            text = text + ":" if text and not text.endswith(":") else text
        if text:
            out.append(text)
            para.append(text)
        if literal_next:
            flush_para()
        i += 1
    flush_para()
    text = "\n".join(out)
    text = re.sub(r"[ \t]+\n", "\n", text)
    text = re.sub(r"\n{3,}", "\n\n", text).strip() + "\n"
    return text, [s for s in sections if s.title and s.paragraphs]


def dedent_block(block: list[str]) -> list[str]:
    while block and not block[-1].strip():
        block = block[:-1]
    while block and not block[0].strip():
        block = block[1:]
    if not block:
        return []
    d = min(indent_of(b) for b in block if b.strip())
    return [b[d:].rstrip() for b in block]


@dataclass
class Corpus:
    train: list[str]          # one plain-text document per training file
    held_out: list[str]       # one per held-out file
    chat: list[tuple[str, str]]  # (user, assistant) pairs from training files' sections
    train_files: list[str]
    held_out_files: list[str]

    def chars(self) -> tuple[int, int]:
        return sum(map(len, self.train)), sum(map(len, self.held_out))


def is_held_out(rel: str) -> bool:
    return int(hashlib.sha1(rel.encode()).hexdigest(), 16) % HELD_OUT_MODULUS == 0


QUESTIONS = ["Tell me about {}.", "What is {}?", "Explain {}.", "Can you describe {}?",
             "What should I know about {}?", "Give me an overview of {}."]


def load(docs: Path = DEFAULT_DOCS, seed: int = 0) -> Corpus:
    if not docs.is_dir():
        raise SystemExit(
            f"{docs} not found: install Debian's python3.11-doc (apt-get install python3.11-doc), "
            "or extract it with `apt-get download python3.11-doc && dpkg-deb -x python3.11-doc_*.deb DIR` "
            "and pass --docs DIR/usr/share/doc/python3.11/html/_sources")
    rng = random.Random(seed)
    files = sorted(p for p in docs.rglob("*.rst.txt"))
    c = Corpus([], [], [], [], [])
    for p in files:
        rel = p.relative_to(docs).as_posix()[: -len(".rst.txt")]
        if any(rel == s or rel.startswith(s + "/") or rel == s for s in SKIP):
            continue
        text, sections = rst_to_text(p.read_text(encoding="utf-8"))
        if len(text) < 200:
            continue
        if is_held_out(rel):
            c.held_out.append(text)
            c.held_out_files.append(rel)
            continue
        c.train.append(text)
        c.train_files.append(rel)
        for s in sections:
            title = s.title.rstrip(".:")
            if len(title) > 80 or len(s.paragraphs[0]) < 80:
                continue
            answer, total = [], 0
            for para in s.paragraphs:
                if total and total + len(para) > 700:
                    break
                answer.append(para)
                total += len(para)
            question = rng.choice(QUESTIONS).format(title)
            c.chat.append((question, "\n\n".join(answer)))
    return c


if __name__ == "__main__":
    import argparse
    import sys
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", type=Path, default=DEFAULT_DOCS)
    ap.add_argument("--show", help="print the plain text of one file (path under --docs, no suffix)")
    ap.add_argument("--held-out", action="store_true",
                    help="print the held-out text exactly as train.py writes held_out.txt")
    a = ap.parse_args()
    if a.held_out:
        sys.stdout.write("\n\n".join(load(a.docs).held_out))
    elif a.show:
        t, secs = rst_to_text((a.docs / (a.show + ".rst.txt")).read_text())
        print(t)
        for s in secs[:5]:
            print("##", s.title, "|", s.paragraphs[0][:200])
    else:
        c = load(a.docs)
        tr, ho = c.chars()
        print(f"train: {len(c.train)} files, {tr / 1e6:.2f} MB; held out: {len(c.held_out)} files, "
              f"{ho / 1e6:.2f} MB; chat pairs: {len(c.chat)} ({sum(len(q) + len(x) for q, x in c.chat) / 1e6:.2f} MB)")
        print("held out:", ", ".join(c.held_out_files))
