"""Checks `ringbench attn`'s outputs against a NumPy fixture, without NumPy (the GPU machine may lack it).

Usage: python3 scripts/npy_close.py OUT_DIR FIXTURE_DIR TOL
For each of out, lse, dq, dk, dv: OUT_DIR/NAME.npy against FIXTURE_DIR/expected_NAME.npy, the rule of
the Rust tests (`reference/src/compare.rs`): max |got - want| / max |want| <= TOL, shapes equal, and any
NaN or infinity on either side a failure (never folded away by max). Exit 0 when all hold, else 1.
"""
import ast
import math
import struct
import sys
from pathlib import Path

NAMES = ["out", "lse", "dq", "dk", "dv"]
FORMATS = {"<f4": ("f", 4), "<f8": ("d", 8)}


def read_npy(path):
    """(shape, values in C order) of a little-endian f32 or f64 .npy file of format version 1, 2 or 3."""
    data = path.read_bytes()
    if data[:6] != b"\x93NUMPY":
        raise ValueError(f"{path}: not a .npy file")
    major = data[6]
    if major == 1:
        (header_len,), start = struct.unpack("<H", data[8:10]), 10
    elif major in (2, 3):
        (header_len,), start = struct.unpack("<I", data[8:12]), 12
    else:
        raise ValueError(f"{path}: .npy format version {major} is not known")
    header = ast.literal_eval(data[start:start + header_len].decode("latin1"))
    if header["descr"] not in FORMATS:
        raise ValueError(f"{path}: values of {header['descr']}; expected {' or '.join(FORMATS)}")
    code, size = FORMATS[header["descr"]]
    shape = tuple(header["shape"])
    count = math.prod(shape)
    body = data[start + header_len:]
    if len(body) != count * size:
        raise ValueError(f"{path}: {len(body)} bytes of values, expected {count * size}")
    values = struct.unpack(f"<{count}{code}", body)
    if header["fortran_order"] and len(shape) > 1:
        values = c_order(values, shape)
    return shape, values


def c_order(values, shape):
    """Values stored in Fortran order (first axis fastest), listed in C order (last axis fastest)."""
    strides, step = [], 1
    for n in shape:
        strides.append(step)
        step *= n
    out = []
    for flat in range(len(values)):
        offset, rest = 0, flat
        for n, stride in zip(reversed(shape), reversed(strides)):
            offset += (rest % n) * stride
            rest //= n
        out.append(values[offset])
    return out


def compare(got_path, want_path, tol):
    """One line saying how far got is from want, and whether it is within tol."""
    got_shape, got = read_npy(got_path)
    want_shape, want = read_npy(want_path)
    if got_shape != want_shape:
        return False, f"shape {got_shape}, expected {want_shape}"
    scale, worst, at = 0.0, 0.0, 0
    for i, (g, w) in enumerate(zip(got, want)):
        if not math.isfinite(g) or not math.isfinite(w):
            return False, f"value {i}: got {g}, expected {w} (not finite)"
        scale = scale if scale >= abs(w) else abs(w)
        d = abs(g - w)
        if d > worst:
            worst, at = d, i
    rel = worst / scale if scale > 0 else (0.0 if worst == 0 else math.inf)
    return rel <= tol, f"max |got - want| = {worst:.3e} at {at} ({rel:.3e} of the scale {scale:.3e})"


def main():
    if len(sys.argv) != 4:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    out, fixture, tol = Path(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3])
    passed = True
    for name in NAMES:
        try:
            ok, said = compare(out / f"{name}.npy", fixture / f"expected_{name}.npy", tol)
        except (OSError, ValueError, KeyError, SyntaxError) as e:
            ok, said = False, str(e)
        passed &= ok
        print(f"{name}: {'ok' if ok else 'FAILED'}: {said}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
