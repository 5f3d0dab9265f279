"""Where the numba kernels spend their time, by source line and inlined function: `perf record`
of one `llm-replay` command, each sample in the kernels' machine code mapped to its line and
inline chain with `addr2line -i` on the object code numba loaded from its cache.

    python bench/perf_lines.py record --out /tmp/prof -- run TRACE -c fleet.yaml --quiet --force
    python bench/perf_lines.py report /tmp/prof

Needs `perf` and binutils, and kernels built with line tables in a cache of their own:
`record` sets NUMBA_DEBUGINFO=1 (and NUMBA_BOUNDSCHECK=0) with NUMBA_CACHE_DIR=<out>/cache,
and turns off the variable lifetimes that numba extends under debug info (they keep every value
live and change the code); the first record compiles the kernels (minutes). Even so a build with
debug info is not the one that runs: LLVM keeps some calls that it inlines without (routing.arrive,
route, admit, quiet.catch_up_steps: their call lines then show up hot, and are not in a normal
build), so read the lines inside the functions, not the calls. `report` prints the samples by
innermost function, by function with what is inlined into it, by line and by inline chain.
"""

from __future__ import annotations

import argparse
import bisect
import collections
import json
import os
import re
import subprocess
import sys
from pathlib import Path


def _child(out: Path, argv: list[str]) -> int:
    """Runs inside `perf record`: the command, keeping each cached library's object code as numba
    loads it; then where each was loaded (out/libs.json)."""
    from numba.core import codegen, cpu

    finalize = cpu.CPUTargetOptions.finalize

    def no_extended_lifetimes(self, flags, options):
        finalize(self, flags, options)
        flags.dbg_extend_lifetimes = False

    cpu.CPUTargetOptions.finalize = no_extended_lifetimes
    loaded = []
    unserialize = codegen.CPUCodeLibrary._unserialize.__func__

    def keep(cls, cg, state):
        library = unserialize(cls, cg, state)
        if state[1] == "object":
            loaded.append((library, bytes(state[2][0])))
        return library

    codegen.CPUCodeLibrary._unserialize = classmethod(keep)
    from replay.cli.app import main

    try:
        return main(argv)
    finally:
        _dump(out, loaded)


def _dump(out: Path, loaded: list) -> None:
    libs = []
    for k, (library, code) in enumerate(loaded):
        path = out / f"lib{k}.o"
        path.write_bytes(code)
        sections = {}  # name -> (load address, size); each code section is loaded apart
        for value, kind, name in _symbols(path):
            if kind not in "TW":
                continue
            try:
                addr = library._codegen._engine.get_function_address(name)
            except Exception:  # noqa: BLE001 - a symbol MCJIT does not export
                addr = 0
            if addr:
                section = _section_of(path, name)
                if section and section not in sections:
                    sections[section] = addr - value
        sizes = _section_sizes(path)
        libs += [{"obj": str(path), "section": s, "base": base, "size": sizes.get(s, 0)} for s, base in sections.items()]
    (out / "libs.json").write_text(json.dumps(libs))


def _symbols(path: Path) -> list[tuple[int, str, str]]:
    rows = subprocess.run(["nm", "--defined-only", str(path)], capture_output=True, text=True).stdout.splitlines()
    return [(int(p[0], 16), p[1], p[2]) for p in (r.split() for r in rows) if len(p) == 3]


def _section_sizes(path: Path) -> dict[str, int]:
    text = subprocess.run(["readelf", "-S", "-W", str(path)], capture_output=True, text=True).stdout
    return {m.group(1): int(m.group(2), 16)
            for m in re.finditer(r"\]\s+(\.l?text\S*)\s+PROGBITS\s+\S+\s+\S+\s+(\S+)", text)}


def _section_of(path: Path, name: str) -> str | None:
    text = subprocess.run(["objdump", "-t", str(path)], capture_output=True, text=True).stdout
    for line in text.splitlines():
        if line.endswith(" " + name):
            parts = line.split()
            return next((p for p in parts if p.startswith(".text") or p.startswith(".ltext")), None)
    return None


def _short(name: str) -> str:
    """A mangled numba name's last two parts (module.function)."""
    m = re.match(r"_ZN((?:\d+[A-Za-z_][A-Za-z0-9_]*?)+)(?:B\d|E)", name)
    if not m:
        return name[:60]
    s, parts, i = m.group(1), [], 0
    while i < len(s):
        j = i
        while s[j].isdigit():
            j += 1
        n = int(s[i:j])
        parts.append(s[j:j + n])
        i = j + n
    return ".".join(parts[-2:])


def report(out: Path, top: int = 30) -> None:
    libs = json.loads((out / "libs.json").read_text())
    starts = sorted((lib["base"], k) for k, lib in enumerate(libs))
    ips = subprocess.run(["perf", "script", "-i", str(out / "perf.data"), "-F", "ip"], capture_output=True,
                         text=True).stdout.split()
    hits = collections.Counter()
    for ip in map(lambda x: int(x, 16), ips):
        i = bisect.bisect_right(starts, (ip, len(libs))) - 1
        if i >= 0:
            k = starts[i][1]
            if ip < libs[k]["base"] + libs[k]["size"]:
                hits[(k, ip - libs[k]["base"])] += 1
    inner, outer, lines, chains = (collections.Counter() for _ in range(4))
    by_lib = collections.defaultdict(list)
    for (k, off), n in hits.items():
        by_lib[k].append((off, n))
    root = str(Path(__file__).resolve().parents[1]) + "/"
    for k, items in by_lib.items():
        lib = libs[k]
        text = subprocess.run(["addr2line", "-j", lib["section"], "-e", lib["obj"], "-i", "-f", "-a",
                               *(hex(o) for o, _ in items)], capture_output=True, text=True).stdout.splitlines()
        frames, cur = [], None
        for line in text:
            if line.startswith("0x"):
                if cur is not None:
                    frames.append(cur)
                cur = []
            else:
                cur.append(line)
        frames.append(cur)
        for (_, n), chain in zip(items, frames):
            fr = [(_short(chain[i]), chain[i + 1].replace(root, "").split(" ")[0]) for i in range(0, len(chain) - 1, 2)]
            if fr:
                inner[fr[0][0]] += n
                lines[fr[0][1]] += n
                chains[" < ".join(f for f, _ in fr[:3])] += n
                for f in {f for f, _ in fr}:
                    outer[f] += n
    total = sum(hits.values())
    print(f"{len(ips)} samples, {total} ({100 * total / max(1, len(ips)):.1f}%) in the kernels")
    for title, counts in (("innermost function", inner), ("function, with what is inlined into it", outer),
                          ("line", lines), ("inline chain", chains)):
        print(f"--- {title} (% of the kernels' samples)")
        for key, n in counts.most_common(top):
            print(f"{100 * n / total:6.2f}  {key}")


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        return _child(Path(sys.argv[2]), sys.argv[3:])
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="what", required=True)
    rec = sub.add_parser("record")
    rec.add_argument("--out", type=Path, required=True)
    rec.add_argument("--freq", type=int, default=1999)
    rec.add_argument("--cache", type=Path, default=None, help="numba's cache for the debug build (default OUT/cache)")
    rec.add_argument("argv", nargs=argparse.REMAINDER, help="-- then the llm-replay command line")
    rep = sub.add_parser("report")
    rep.add_argument("out", type=Path)
    rep.add_argument("--top", type=int, default=30)
    args = ap.parse_args()
    if args.what == "report":
        report(args.out, args.top)
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, NUMBA_DEBUGINFO="1", NUMBA_BOUNDSCHECK="0", NUMBA_CACHE_DIR=str(args.cache or args.out / "cache"))
    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    return subprocess.run(["perf", "record", "-F", str(args.freq), "-o", str(args.out / "perf.data"), sys.executable,
                           __file__, "--child", str(args.out), *argv], env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
