#!/usr/bin/env python3
"""Prints the file-level call graph of a directory's object files and fails
on a circle.

Usage: tools/file_calls.py build/rel/obj/text/template [more dirs...]

An edge A -> B means A.o uses a global symbol (function or data) that B.o
defines, read from `nm` (defined vs undefined symbols per object), so it
sees only calls between files, never a file's static functions. A circle is
a set of files that reach each other through such edges (a strongly
connected component of more than one file). The files are printed bottom
first: each after everything it uses. Exits 1 when there is a circle.
Build the objects first (ninja); the check reads them, not the sources
(objects whose source file is gone are left out).
"""
import glob
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def symbols(obj):
    out = subprocess.run(["nm", "-g", obj], check=True, capture_output=True, text=True).stdout
    defined, used = set(), set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] not in "Uw":
            defined.add(parts[2])
        elif len(parts) == 2 and parts[0] == "U":
            used.add(parts[1])
    return defined, used


def stale(obj):
    """An object left in build/<variant>/obj/ by a source file since removed."""
    parts = os.path.normpath(obj).split(os.sep)
    if "obj" not in parts:
        return False
    rel = os.path.join(*parts[parts.index("obj") + 1:])
    return not os.path.exists(os.path.join(ROOT, os.path.splitext(rel)[0] + ".c"))


def graph(dirs):
    objs = sorted(o for d in dirs for o in glob.glob(os.path.join(d, "*.o")) if not stale(o))
    name = {o: os.path.splitext(os.path.basename(o))[0] for o in objs}
    syms = {o: symbols(o) for o in objs}
    owner = {s: o for o in objs for s in syms[o][0]}
    edges = {name[o]: sorted({name[owner[s]] for s in syms[o][1] if s in owner and owner[s] != o})
             for o in objs}
    return edges


def components(edges):
    """Tarjan's strongly connected components, in reverse topological order
    (a component comes after every component it reaches): bottom first."""
    index, low, on, stack, out, n = {}, {}, set(), [], [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def main():
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    edges = graph(sys.argv[1:])
    if not edges:
        print("no object files (build them first)", file=sys.stderr)
        return 2
    circles = 0
    for comp in components(edges):
        if len(comp) > 1:
            circles += 1
            print("CIRCLE: " + " <-> ".join(comp))
        for v in comp:
            print(f"{v} -> {', '.join(edges[v]) if edges[v] else '(nothing here)'}")
    return 1 if circles else 0


if __name__ == "__main__":
    sys.exit(main())
