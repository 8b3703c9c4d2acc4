"""`torchtpu.advise()`: the report of the matrix products and convolutions
whose shapes a TPU pads or under-fills, as the core measured them
(`exec/advice.rs`), grouped by the model's source line."""
import sys

from . import _C


def advise(file=None, clear: bool = False) -> list:
    """Reports the matrix products, convolutions and attention of the
    programs built so far whose shapes a TPU pads or under-fills (minor
    dimensions not multiples of 128, rows not multiples of the tile's 8 or
    16, attention heads narrower than 128, too few rows to fill the matrix
    unit): each with the model code's line, the shapes, the estimated
    fraction of padded work and the change that removes it. It reasons about
    shapes, not the hardware it runs on, so it works on every plugin.
    Prints to `file` (default stderr) and returns the findings as dicts;
    `clear` forgets them afterwards. `TORCHTPU_ADVISE=1` prints it at exit."""
    findings = _C.advice()
    out = file or sys.stderr
    if not findings:
        print("torchtpu.advise: no matrix product or convolution a TPU would pad or under-fill", file=out)
    else:
        print(f"torchtpu.advise: {len(findings)} matrix products and convolutions a TPU pads or under-fills, "
              "by the model's line (shapes, not this machine's hardware):", file=out)
    by_line = {}
    for f in findings:
        by_line.setdefault(f["source"].removesuffix(" (backward)"), []).append(f)
    for line, products in by_line.items():
        print(line, file=out)
        for f in products:
            lhs, rhs = ("x".join(map(str, s)) for s in f["shapes"])
            backward = " (backward)" if f["source"].endswith("(backward)") else ""
            print(f"  {f['op']}{backward}: {f['kind']} of {f['dtype']} [{lhs}] by [{rhs}], "
                  f"~{100 * f['wasted']:.0f}% of its work padding or idle rows", file=out)
            for reason in f["reasons"]:
                print(f"    - {reason}", file=out)
    if clear:
        _C.clear_advice()
    return findings
