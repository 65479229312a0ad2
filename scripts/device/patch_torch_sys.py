"""Fits torch-sys's C wrapper to an older PyTorch, for the device kit (scripts/device-kit.sh).

tch's C wrapper (`libtch/torch_api_generated.cpp` of torch-sys) is generated from one PyTorch
release and calls every operator of it. Against an older PyTorch, the operators added since (and
those whose signature changed) do not compile. This script compares the wrapper's declarations
with those of the torch-sys release generated from the older PyTorch, and replaces the body of
each function that differs with one that fails naming it (tch turns that into an error), so every
symbol still exists and nothing calls an operator that is not there.

It then checks that kart calls none of them: the tch methods that reach a replaced function (from
tch's generated wrappers) must appear nowhere in kart's sources.

    python3 patch_torch_sys.py --wrapper TORCH_SYS_DIR --reference OLD_TORCH_SYS_DIR \
        --tch TCH_DIR --torch-version 2.11.0 --sources DIR [DIR ...] --list OUT.txt

Exits 1, naming the calls, when kart calls a replaced operator.
"""

import argparse
import pathlib
import re
import sys

DECLARATION = re.compile(r"^([a-z0-9_]+ \*?)(atg_\w+)\((.*)\);$", re.M)


def declarations(header: pathlib.Path) -> dict[str, str]:
    """Each wrapper function of `header` by name, with its whole declaration."""
    return {m.group(2): m.group(0) for m in DECLARATION.finditer(header.read_text())}


def stub(source: str, name: str, returns: str, torch_version: str) -> str:
    """`source` with the body of function `name` failing with a message naming it."""
    start = re.search(rf"^{re.escape(returns)}{name}\(", source, re.M)
    if start is None:
        raise SystemExit(f"patch_torch_sys: {name} is declared but not defined in the wrapper")
    end = source.index("\n}\n", start.start()) + 3
    signature = source[start.start() : source.index("{", start.start())].rstrip()
    message = f"{name}: not in PyTorch {torch_version}, which this kart was built against"
    failure = f'  PROTECT(throw std::runtime_error("{message}");)\n'
    value = "" if returns.strip() == "void" else "  return 0;\n"
    return source[: start.start()] + f"{signature} {{\n{failure}{value}}}\n" + source[end:]


def tch_methods(tch: pathlib.Path, functions: set[str]) -> set[str]:
    """The methods of tch's generated wrappers that call one of `functions` (`f_x` and `x`)."""
    methods = set()
    for file in (tch / "src/wrappers").glob("*generated*.rs"):
        text = file.read_text()
        for block in re.split(r"\n    pub fn ", text)[1:]:
            name = block.split("(", 1)[0].split("<", 1)[0]
            if any(re.search(rf"\b{f}\(", block) for f in functions):
                methods.add(name)
                methods.add(name.removeprefix("f_"))
    return methods


def calls(sources: list[pathlib.Path], methods: set[str]) -> list[str]:
    """`file:line: text` of each call of one of `methods` in the Rust files under `sources`."""
    if not methods:
        return []
    pattern = re.compile(r"(?:\.|::)(" + "|".join(map(re.escape, sorted(methods))) + r")\s*[(<]")
    found = []
    for root in sources:
        for file in sorted(root.rglob("*.rs")):
            for number, line in enumerate(file.read_text().splitlines(), 1):
                if pattern.search(line):
                    found.append(f"{file}:{number}: {line.strip()}")
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wrapper", type=pathlib.Path, required=True, help="torch-sys to patch, in place")
    parser.add_argument("--reference", type=pathlib.Path, required=True,
                        help="the torch-sys release generated from the older PyTorch")
    parser.add_argument("--tch", type=pathlib.Path, required=True, help="the tch crate using --wrapper")
    parser.add_argument("--torch-version", required=True)
    parser.add_argument("--sources", type=pathlib.Path, nargs="+", required=True)
    parser.add_argument("--list", type=pathlib.Path, required=True, help="where to write the replaced functions")
    args = parser.parse_args()

    header = args.wrapper / "libtch/torch_api_generated.h"
    wanted = declarations(header)
    available = declarations(args.reference / "libtch/torch_api_generated.h")
    if not wanted or not available:
        raise SystemExit("patch_torch_sys: no wrapper declarations found")
    differing = sorted(name for name, text in wanted.items() if available.get(name) != text)

    cpp = args.wrapper / "libtch/torch_api_generated.cpp"
    source = cpp.read_text()
    for name in differing:
        returns = DECLARATION.search(wanted[name]).group(1)
        source = stub(source, name, returns, args.torch_version)
    cpp.write_text(source)
    args.list.write_text("".join(f"{name}\n" for name in differing))
    print(f"patch_torch_sys: {len(differing)} of {len(wanted)} wrapper functions are not in PyTorch "
          f"{args.torch_version}: {', '.join(differing) or 'none'}")

    used = calls(args.sources, tch_methods(args.tch, set(differing)))
    if used:
        print("patch_torch_sys: kart calls operators that are not in PyTorch "
              f"{args.torch_version}:\n  " + "\n  ".join(used), file=sys.stderr)
        return 1
    print("patch_torch_sys: kart calls none of them")
    return 0


if __name__ == "__main__":
    sys.exit(main())
