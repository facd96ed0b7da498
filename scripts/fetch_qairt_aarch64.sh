#!/usr/bin/env bash
# Fetches the device side of QAIRT from the pinned public wheel and unpacks it into
# build/ (never into git): the aarch64 libraries vlad dlopens on the board and the
# Hexagon v73 skel the cDSP loads. No QAIRT SDK download is needed.
#
#   scripts/fetch_qairt_aarch64.sh            prints the unpacked directory
#
# The wheel is fetched with pip by name, version, platform and Python tag, and its SHA-256
# must equal the pin below (the same pin as meta-vla's qairt-wheel recipe). Output:
#   build/qairt-aarch64/lib/   libQnnHtp.so libQnnSystem.so libQnnHtpV73Stub.so (aarch64)
#   build/qairt-aarch64/dsp/   libQnnHtpV73Skel.so (Hexagon; the ADSP_LIBRARY_PATH dir)
#   build/qairt-aarch64/Qualcomm_LICENSE.pdf   the license these files are under
#   build/qairt-aarch64/qairt-version          the QNN build id of libQnnHtp.so (e.g. 2.51.0.260929181845)
# libQnnHtpV73Stub.so needs the board's libcdsprpc.so (FastRPC, from the BSP).
# Idempotent: an unpacked tree stamped with the pinned hash is left alone.
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

wheel_name="onnxruntime-qnn"
wheel_version="2.7.0"
wheel_platform="manylinux_2_34_aarch64"
wheel_python="3.11"
wheel_file="onnxruntime_qnn-2.7.0-cp311-cp311-manylinux_2_34_aarch64.whl"
wheel_sha256="ad08bbfebd7c07ffe83995418303215f46cb25a89e12676f47ee20c32002eaad"
# The members taken from the wheel (everything else is the ONNX Runtime plugin, other
# Hexagon versions and host-side compilers, which a v73 board running context binaries
# never loads).
libs=(libQnnHtp.so libQnnSystem.so libQnnHtpV73Stub.so)
skel=libQnnHtpV73Skel.so

out="${QAIRT_AARCH64_DIR:-$repo_root/build/qairt-aarch64}"
cache="$repo_root/build/wheels"
stamp="$out/.wheel.sha256"

die() {
    echo "fetch_qairt_aarch64: $*" >&2
    exit 1
}

if [[ -f $stamp && "$(cat "$stamp")" == "$wheel_sha256" ]]; then
    echo "$out"
    exit 0
fi

python="$repo_root/.venv/bin/python"
[[ -x $python ]] || python="$(command -v python3)" || die "no python3 to run pip with"
mkdir -p "$cache"
wheel="$cache/$wheel_file"
if [[ ! -f $wheel ]] || ! echo "$wheel_sha256  $wheel" | sha256sum --check --status; then
    rm -f "$wheel"
    echo "fetch_qairt_aarch64: downloading $wheel_name==$wheel_version ($wheel_platform) with pip" >&2
    "$python" -m pip download --quiet --disable-pip-version-check --no-input --no-deps \
        --only-binary=:all: --platform "$wheel_platform" --python-version "$wheel_python" \
        "$wheel_name==$wheel_version" -d "$cache" >&2 ||
        die "pip could not download $wheel_name==$wheel_version for $wheel_platform"
    [[ -f $wheel ]] || die "pip downloaded something other than $wheel_file into $cache"
fi
have="$(sha256sum "$wheel" | cut -d' ' -f1)"
if [[ $have != "$wheel_sha256" ]]; then
    rm -f "$wheel"
    die "$wheel_file has SHA-256 $have, the pin is $wheel_sha256 (removed; refusing to unpack it)"
fi

rm -rf "$out.tmp"
mkdir -p "$out.tmp/lib" "$out.tmp/dsp"
"$python" - "$wheel" "$out.tmp" "$skel" "${libs[@]}" <<'PY'
import os, sys, zipfile
wheel, out, skel, libs = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
wanted = {f"onnxruntime_qnn/{n}": os.path.join(out, "lib", n) for n in libs}
wanted[f"onnxruntime_qnn/{skel}"] = os.path.join(out, "dsp", skel)
wanted["onnxruntime_qnn/Qualcomm_LICENSE.pdf"] = os.path.join(out, "Qualcomm_LICENSE.pdf")
with zipfile.ZipFile(wheel) as z:
    names = set(z.namelist())
    missing = sorted(set(wanted) - names)
    if missing:
        sys.exit(f"fetch_qairt_aarch64: {wheel} lacks {', '.join(missing)}")
    for member, dest in wanted.items():
        with z.open(member) as src, open(dest, "wb") as dst:
            dst.write(src.read())
        os.chmod(dest, 0o755 if dest.endswith(".so") else 0o644)
PY

# The QNN build the libraries report (backendGetBuildId returns the same string); vlad
# compares it with the build recorded in each context binary.
build_id="$(grep -aoE 'v2\.[0-9]+\.[0-9]+\.[0-9]{6,}' "$out.tmp/lib/libQnnHtp.so" | head -n 1)"
[[ -n $build_id ]] || die "no QNN build id found in libQnnHtp.so of $wheel_file"
echo "${build_id#v}" > "$out.tmp/qairt-version"
echo "$wheel_sha256" > "$out.tmp/.wheel.sha256"
rm -rf "$out"
mv "$out.tmp" "$out"
echo "fetch_qairt_aarch64: QAIRT ${build_id#v} device libraries in $out" >&2
echo "$out"
