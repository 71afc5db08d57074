"""``python -m torch_vnpu.patches``: the patches torch_vnpu applies to other libraries, with the installed
versions. ``--markdown`` prints the docs page "Where PyTorch is not device-neutral" (docs/device_neutrality.md
is this output; ``make docs`` checks it is current)."""

from __future__ import annotations

import argparse
import sys

from . import PATCHES, installed_version

_PAGE_INTRO = """# Where PyTorch is not device-neutral

vnpu is an ordinary PrivateUse1 device, and most of PyTorch treats it as one. The places below decide by a list of
device types (`"cuda"`, `"cpu"`, ...) instead of asking the device, and vnpu would get a wrong result, an error or
a slow path there. torch_vnpu replaces the deciding function for vnpu only; other devices keep PyTorch's behaviour.
Each entry names what is replaced, why, and the upstream change that would make the patch unnecessary: the list a
chip team would take upstream.

This page is generated from `src/torch_vnpu/patches/registry.py` (`python -m torch_vnpu.patches --markdown`);
`python -m torch_vnpu.patches` lists the same patches with the library versions installed. Each patch was checked
against the library version given; a test fails when an installed version differs.

*When* is when the patch is applied: `import` (`import torch`), `first compile` (the first `torch.compile`),
`import of <module>` (when that module is first imported), `integration` (when the library is imported, unless
`VNPU_INTEGRATIONS` switches its adapter off), or a mode switched on explicitly (port mode, the sanitizer), which
restores everything when switched off.
"""


def markdown() -> str:
    out = [_PAGE_INTRO]
    section = None
    for p in PATCHES:
        group = p.library if p.library != "torch" else "PyTorch"
        if p.when in ("port mode", "sanitizer"):
            group = "Modes switched on explicitly"
        if group != section:
            section = group
            out.append(f"\n## {group}\n")
        targets = ", ".join(f"`{t}`" for t in p.targets)
        out.append(f"### `{p.id}`\n\n"
                   f"- **Replaces:** {targets}\n"
                   f"- **Why:** {p.reason}\n"
                   f"- **Upstream:** {p.upstream}\n"
                   f"- **Checked against:** {p.library} {p.checked}; **when:** {p.when}; "
                   f"**applied by:** `{p.applied_by}`\n")
    return "\n".join(out)


def table() -> str:
    rows = [("patch", "library", "checked", "installed", "when")]
    for p in PATCHES:
        rows.append((p.id, p.library, p.checked, installed_version(p.library) or "-", p.when))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torch_vnpu.patches", description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", action="store_true", help="print the docs page instead of the table")
    args = parser.parse_args(argv)
    print(markdown() if args.markdown else table())
    if not args.markdown:
        stale = [p for p in PATCHES if (installed_version(p.library) or p.checked) != p.checked]
        if stale:
            print(f"\n{len(stale)} patch(es) were checked against another version than the one installed: "
                  "re-check them before relying on them.", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
