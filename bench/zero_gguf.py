#!/usr/bin/env python3
"""Copy a GGUF file with every tensor data byte set to zero.

    python3 bench/zero_gguf.py IN.gguf OUT.gguf

The header (magic, version, counts), all metadata key/value pairs (the
tokenizer included) and the tensor infos are copied byte for byte; the data
section (from the end of the tensor infos rounded up to `general.alignment`,
default 32, to the end of the file) is written as zeros, so the file keeps
its size and layout but gzips to a few MB. Useful for timing runs, whose speed
does not depend on the weight values. Standard library only.
"""
import struct
import sys

GGUF_MAGIC = b"GGUF"
# GGUF metadata value types -> struct format of a scalar.
SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f",
          7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9
# ggml tensor types -> (elements per block, bytes per block), for the size check.
GGML_TYPES = {0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18),
              3: ("Q4_1", 32, 20), 6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24),
              8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 36), 10: ("Q2_K", 256, 84),
              11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144),
              13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210),
              15: ("Q8_K", 256, 292), 24: ("I8", 1, 1), 25: ("I16", 1, 2),
              26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8),
              30: ("BF16", 1, 2)}


class Reader:
    def __init__(self, f):
        self.f = f
        self.pos = 0

    def raw(self, n):
        b = self.f.read(n)
        if len(b) != n:
            raise ValueError(f"unexpected end of file at byte {self.pos} (wanted {n} bytes)")
        self.pos += n
        return b

    def unpack(self, fmt):
        return struct.unpack(fmt, self.raw(struct.calcsize(fmt)))[0]

    def string(self):
        return self.raw(self.unpack("<Q")).decode("utf-8", errors="replace")

    def value(self, vtype):
        if vtype in SCALAR:
            return self.unpack(SCALAR[vtype])
        if vtype == STRING:
            return self.string()
        if vtype == ARRAY:
            etype = self.unpack("<I")
            count = self.unpack("<Q")
            if etype in SCALAR:  # read scalar arrays in one go
                fmt = SCALAR[etype][1]
                size = struct.calcsize("<" + fmt)
                return list(struct.unpack(f"<{count}{fmt}", self.raw(size * count)))
            return [self.value(etype) for _ in range(count)]
        raise ValueError(f"unknown GGUF value type {vtype} at byte {self.pos}")


def parse(path):
    """Returns (version, kv dict, tensor infos, data offset, file size)."""
    with open(path, "rb") as f:
        r = Reader(f)
        if r.raw(4) != GGUF_MAGIC:
            raise ValueError(f"{path}: not a GGUF file (bad magic)")
        version = r.unpack("<I")
        if version not in (2, 3):
            raise ValueError(f"{path}: GGUF version {version} not supported (2 or 3)")
        n_tensors = r.unpack("<Q")
        n_kv = r.unpack("<Q")
        kv = {}
        for _ in range(n_kv):
            key = r.string()
            kv[key] = r.value(r.unpack("<I"))
        tensors = []
        for _ in range(n_tensors):
            name = r.string()
            n_dims = r.unpack("<I")
            dims = [r.unpack("<Q") for _ in range(n_dims)]
            ttype = r.unpack("<I")
            offset = r.unpack("<Q")
            tensors.append((name, dims, ttype, offset))
        end_of_infos = r.pos
        f.seek(0, 2)
        file_size = f.tell()
    alignment = int(kv.get("general.alignment", 32))
    data_offset = (end_of_infos + alignment - 1) // alignment * alignment
    return version, kv, tensors, end_of_infos, alignment, data_offset, file_size


def tensor_bytes(dims, ttype):
    if ttype not in GGML_TYPES:
        return None
    _, block, size = GGML_TYPES[ttype]
    n = 1
    for d in dims:
        n *= d
    return n // block * size


def main(argv):
    if len(argv) != 3:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    src, dst = argv[1], argv[2]
    version, kv, tensors, end_of_infos, alignment, data_offset, file_size = parse(src)
    if data_offset > file_size:
        raise ValueError(f"data offset {data_offset} is past the end of the file ({file_size})")
    data_size = file_size - data_offset
    # Check that every tensor lies inside the data section (types we know).
    known, end = 0, 0
    for name, dims, ttype, offset in tensors:
        if offset % alignment:
            raise ValueError(f"tensor {name}: offset {offset} not aligned to {alignment}")
        nb = tensor_bytes(dims, ttype)
        if nb is not None:
            known += 1
            end = max(end, offset + nb)
    if end > data_size:
        raise ValueError(f"tensors end at data byte {end}, past the data section ({data_size} bytes)")
    types = sorted({GGML_TYPES.get(t, (f"type{t}",))[0] for _, _, t, _ in tensors})

    with open(src, "rb") as fi, open(dst, "wb") as fo:
        fo.write(fi.read(data_offset))
        zeros = bytes(1 << 20)
        left = data_size
        while left:
            n = min(left, len(zeros))
            fo.write(zeros[:n])
            left -= n
    print(f"GGUF v{version}: {len(kv)} kv pairs, {len(tensors)} tensors ({', '.join(types)}), "
          f"arch {kv.get('general.architecture')!r}, alignment {alignment}")
    print(f"tensor infos end at {end_of_infos}; data offset {data_offset}; "
          f"data {data_size} bytes (tensors of known type end at {end}, {known}/{len(tensors)} checked); "
          f"file {file_size} bytes")
    print(f"wrote {dst}: bytes [0, {data_offset}) copied, {data_size} zero bytes after")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
