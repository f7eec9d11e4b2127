#!/usr/bin/env python3
"""Lists Rust functions longer than a bound (STYLE.md: functions under 80 lines).

Usage: scripts/fn-lengths.py [--max N] [--all] PATH...

Each PATH is a .rs file or a directory searched for them. A function's length is the
number of lines from its `fn` line to its closing brace, both included. Prints one line
per function over the bound (`LINES path:line name`), longest first, and exits 1 if any.
--all prints every function. Strings, characters and comments are skipped when braces
are matched, so a brace inside a literal does not end a function.
"""

import os
import re
import sys

FN = re.compile(r"\bfn\s+([A-Za-z_][A-Za-z0-9_]*)")


def code_only(text):
    """The text with comments and the insides of literals blanked (newlines kept)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif (m := re.match(r'b?r(#*)"', text[i:])) and (
            i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")
        ):
            end = '"' + m.group(1)
            j = text.find(end, i + m.end())
            j = n if j < 0 else j + len(end)
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            j += 1
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "'" and (m := re.match(r"'(\\.[^']*|[^\\'])'", text[i:])):
            out.append(" " * m.end())
            i += m.end()
        else:
            out.append(c)
            i += 1
    return "".join(out)


def functions(path):
    """(name, first line, lines) of every function with a body in `path`."""
    with open(path, encoding="utf-8") as f:
        code = code_only(f.read())
    found = []
    for m in FN.finditer(code):
        # The body starts at the first `{` not inside the signature's parentheses,
        # brackets or generics; a `;` first means a declaration without a body.
        depth, j = 0, m.end()
        while j < len(code):
            ch = code[j]
            if ch in "([":
                depth += 1
            elif ch in ")]":
                depth -= 1
            elif ch == ";" and depth == 0:
                j = -1
                break
            elif ch == "{" and depth == 0:
                break
            j += 1
        if j < 0 or j >= len(code):
            continue
        braces, k = 0, j
        while k < len(code):
            if code[k] == "{":
                braces += 1
            elif code[k] == "}":
                braces -= 1
                if braces == 0:
                    break
            k += 1
        first = code.count("\n", 0, m.start()) + 1
        last = code.count("\n", 0, k) + 1
        found.append((m.group(1), first, last - first + 1))
    return found


def rust_files(paths):
    for p in paths:
        if os.path.isfile(p):
            yield p
            continue
        for root, dirs, files in os.walk(p):
            dirs[:] = sorted(d for d in dirs if d not in ("target", ".git"))
            for name in sorted(files):
                if name.endswith(".rs"):
                    yield os.path.join(root, name)


def main(argv):
    bound, show_all, paths = 80, False, []
    it = iter(argv)
    for a in it:
        if a == "--max":
            bound = int(next(it))
        elif a == "--all":
            show_all = True
        else:
            paths.append(a)
    if not paths:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    rows = []
    for path in rust_files(paths):
        for name, line, lines in functions(path):
            if show_all or lines > bound:
                rows.append((lines, f"{path}:{line}", name))
    rows.sort(key=lambda r: (-r[0], r[1]))
    for lines, at, name in rows:
        print(f"{lines:5} {at} {name}")
    return 1 if any(r[0] > bound for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
