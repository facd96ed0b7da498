#!/usr/bin/env bash
# Real bitbake parse of meta-vla against an oe-core + bitbake checkout, offline. Not part of
# CI (the checkouts are not in the repository); run by hand before changing the layer:
#
#   scripts/bitbake_parse.sh <openembedded-core checkout> <bitbake checkout> [build dir]
#   META_QCOM=<meta-qcom checkout> scripts/bitbake_parse.sh ...   (MACHINE iq-9075-evk)
#   META_RAUC=<meta-rauc checkout> scripts/bitbake_parse.sh ...   (dynamic-layers/rauc)
#
# Use the wrynose branches of openembedded-core and meta-qcom with bitbake 2.18. The build
# directory (default /tmp/vla-bitbake-build) gets a local.conf with MACHINE = "qemuarm64"
# (an aarch64 machine from oe-core, standing in for the board) or, with META_QCOM,
# MACHINE = "iq-9075-evk" and QAIRT from meta-qcom's qairt-sdk; INIT_MANAGER = "systemd",
# BB_NO_NETWORK = "1" and no uninative, a scratch packed policy bundle and a scratch QAIRT
# SDK tree holding only file names and the version header. It runs:
#   1. bitbake -p and bitbake-layers show-recipes with no VLA settings (skip reasons),
#   2. the same with VLA_POLICY, VLA_BUNDLE_DIR, QAIRT_SDK_DIR (...) set,
#   3. bitbake -e vlad (SRC_URI, FILES:vlad) and vla-bundle, bitbake vlad -n, the task
#      graph of vla-image (bitbake -g), and vla-bundle's do_verify_bundle for real.
#   4. VLA_QAIRT_PROVIDER = "qairt-wheel": skipped until LICENSE_FLAGS_ACCEPTED has
#      qcom-ai-stack, then parsed; bitbake -e qairt-wheel, and its do_fetch for real with
#      the wheel scripts/fetch_qairt_aarch64.sh downloaded (pip, PyPI) placed in DL_DIR.
# Nothing past that can run offline: the native toolchain cannot be fetched.
set -euo pipefail

if [[ $# -lt 2 ]]; then
    echo "usage: $0 <openembedded-core checkout> <bitbake checkout> [build dir]" >&2
    exit 2
fi
oe_core="$(readlink -f "$1")"
bitbake_dir="$(readlink -f "$2")"
build="$(readlink -m "${3:-/tmp/vla-bitbake-build}")"
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
layer="$repo_root/meta-vla"

for needed in "$oe_core/meta/conf/layer.conf" "$oe_core/oe-init-build-env" "$bitbake_dir/bin/bitbake"; do
    if [[ ! -e "$needed" ]]; then
        echo "bitbake_parse: $needed not found: is that an oe-core / bitbake checkout?" >&2
        exit 2
    fi
done

# Host tools bitbake's HOSTTOOLS check wants and Debian images may lack, and the UTF-8
# locale bitbake insists on.
missing=()
for tool in chrpath cpio diffstat gawk file lz4c zstd; do
    command -v "$tool" >/dev/null || missing+=("$tool")
done
if [[ ${#missing[@]} -gt 0 ]]; then
    echo "bitbake_parse: installing host tools for: ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        chrpath cpio diffstat gawk file lz4 zstd >/dev/null
fi
if ! locale -a 2>/dev/null | grep -qi '^en_US\.utf-\?8$'; then
    echo "bitbake_parse: generating the en_US.UTF-8 locale"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends locales >/dev/null
    sed -i 's/^# *en_US.UTF-8 UTF-8/en_US.UTF-8 UTF-8/' /etc/locale.gen
    locale-gen >/dev/null
fi
export LANG=en_US.UTF-8 LC_ALL=en_US.UTF-8
# bitbake links python3 into its HOSTTOOLS directory and then runs with a minimal PATH: a
# version-manager shim (pyenv) does not survive that, the system interpreter does.
export PATH="/usr/bin:/bin:$PATH"

# Scratch inputs: a packed policy bundle with a few bytes standing in for the context
# binaries (the signature is a placeholder: the build never checks it, the device does),
# and a QAIRT SDK tree with the file names the recipes look for.
scratch="$build/vla-scratch"
bundle="$scratch/bundles/molmoact2-libero-original-tiny"
sdk="$scratch/qairt/2.47.0.250627"
rm -rf "$bundle"
mkdir -p "$bundle/ctx" "$bundle/golden" "$sdk/include/QNN" "$sdk/lib/hexagon-v73/unsigned" \
    "$sdk/lib/aarch64-oe-linux-gcc11.2"
cat > "$bundle/bundle.json" <<'JSON'
{"format": 1, "name": "molmoact2-libero-original-tiny", "version": "0.1.0",
 "policy": "molmoact2", "variant": "original", "soc_model": 77, "htp_arch": 73,
 "min_runtime_version": "0.1.0",
 "components": {"vision": {"binary": "ctx/vision_socid77_archv73.bin",
                           "golden": "golden/vision_io.npz", "graph": null}}}
JSON
# Not a real context binary, but it carries a QNN build id where real ones do (the
# header), which is all the layer's QAIRT version check reads.
printf 'scratch context binary, compiled by QNN v2.47.0.250627\n' > "$bundle/ctx/vision_socid77_archv73.bin"
printf 'not a real npz\n' > "$bundle/golden/vision_io.npz"
python3 - "$bundle" <<'PY'
import hashlib, json, os, sys
bundle = sys.argv[1]
files = []
for root, _, names in os.walk(bundle):
    for name in names:
        path = os.path.join(root, name)
        with open(path, "rb") as data:
            digest = hashlib.sha256(data.read()).hexdigest()
        files.append({"path": os.path.relpath(path, bundle), "size": os.path.getsize(path),
                      "sha256": digest})
manifest = {"format": 1, "name": "molmoact2-libero-original-tiny", "version": "0.1.0",
            "policy": "molmoact2", "soc_model": 77, "htp_arch": 73,
            "min_runtime_version": "0.1.0", "files": sorted(files, key=lambda f: f["path"])}
with open(os.path.join(bundle, "ota-manifest.json"), "w") as out:
    out.write(json.dumps(manifest, indent=2) + "\n")
with open(os.path.join(bundle, "ota-manifest.json.sig"), "w") as out:
    out.write("0" * 128 + "\n")
PY
printf '#define QNN_SDK_BUILD_ID "v2.47.0.250627"\n' > "$sdk/include/QNN/QnnSdkBuildId.h"
touch "$sdk/lib/hexagon-v73/unsigned/libQnnHtpV73Skel.so"
for lib in libQnnHtp.so libQnnSystem.so libQnnHtpV73Stub.so; do
    touch "$sdk/lib/aarch64-oe-linux-gcc11.2/$lib"
done

# oe-init-build-env writes a default local.conf / bblayers.conf on first use.
set +u
# shellcheck disable=SC1091
source "$oe_core/oe-init-build-env" "$build" "$bitbake_dir" >/dev/null
set -u
# Sanity checks refuse to run as root (CI machines and containers are root); the parse
# itself does not care.
touch conf/sanity.conf
layers="$oe_core/meta $layer"
machine="qemuarm64"
if [[ -n "${META_QCOM:-}" ]]; then
    meta_qcom="$(readlink -f "$META_QCOM")"
    # meta-qcom (wrynose) depends on the collection lts-linux-firmware-mixin (newer
    # linux-firmware); parsing needs only the collection name, so a stub layer stands in.
    mixin="$build/stub-lts-linux-firmware-mixin"
    mkdir -p "$mixin/conf"
    cat > "$mixin/conf/layer.conf" <<CONF
BBPATH .= ":\${LAYERDIR}"
BBFILE_COLLECTIONS += "lts-linux-firmware-mixin"
BBFILE_PATTERN_lts-linux-firmware-mixin = "^\${LAYERDIR}/"
BBFILE_PRIORITY_lts-linux-firmware-mixin = "6"
BBFILE_PATTERN_IGNORE_EMPTY_lts-linux-firmware-mixin = "1"
LAYERSERIES_COMPAT_lts-linux-firmware-mixin = "wrynose"
CONF
    layers="$layers $meta_qcom $mixin"
    machine="iq-9075-evk"
fi
rauc_conf=""
if [[ -n "${META_RAUC:-}" ]]; then
    layers="$layers $(readlink -f "$META_RAUC")"
    rauc_conf='DISTRO_FEATURES:append = " rauc vla-rauc"
RAUC_KEY_FILE = "/nonexistent/fleet-rauc.key.pem"
RAUC_CERT_FILE = "/nonexistent/fleet-rauc.cert.pem"'
fi
cat > conf/bblayers.conf <<CONF
BBPATH = "\${TOPDIR}"
BBFILES ?= ""
BBLAYERS ?= "$layers"
CONF
cat > conf/local.conf <<CONF
MACHINE = "$machine"
# The devupstream kernel variants follow a branch head (AUTOREV), which needs the network
# at parse time: pin them to any revision, they are never built here.
SRCREV:pn-linux-qcom-next-upstream = "0000000000000000000000000000000000000000"
SRCREV:pn-linux-qcom-6.18.y-upstream = "0000000000000000000000000000000000000000"
DISTRO ?= "nodistro"
INIT_MANAGER = "systemd"
BB_NO_NETWORK = "1"
INHERIT:remove = "uninative"
DL_DIR = "$build/downloads"
SSTATE_DIR = "$build/sstate-cache"
TMPDIR = "$build/tmp"
CONF_VERSION = "2"
$rauc_conf
include vla.conf
CONF

run() {
    printf '\n$ %s\n' "$*"
    "$@"
}

vla_recipes() {
    # show-recipes prints each recipe's name on one line, its layer, version or skip
    # reason on the next.
    bitbake-layers show-recipes 2>&1 | grep -A1 -E '^(vlad|vla-[a-z-]+|qairt-local|qairt-wheel|packagegroup-vla):' |
        grep -v '^--$' || true
}

echo "== 1. no VLA settings: vla-bundle and qairt-local are skipped, with reasons"
: > conf/vla.conf
run bitbake -p
printf '\n$ bitbake-layers show-recipes | grep -A1 vla\n'
vla_recipes

echo
echo "== 2. VLA_POLICY, VLA_BUNDLE_DIR (and QAIRT_SDK_DIR) set"
cat > conf/vla.conf <<CONF
VLA_POLICY = "molmoact2-libero-original-tiny"
VLA_BUNDLE_DIR = "$scratch/bundles"
VLA_OTA_TRUSTED_KEYS = "a74a3b7188acd4bb7b44c6f9e91907bb950546cb7aceb0657a6bf602dff1573d"
CONF
# Without meta-qcom the local SDK provides QAIRT; with it, meta-qcom's qairt-sdk does.
if [[ -z "${META_QCOM:-}" ]]; then
    echo "QAIRT_SDK_DIR = \"$sdk\"" >> conf/vla.conf
fi
run bitbake -p
printf '\n$ bitbake-layers show-recipes | grep -A1 vla\n'
vla_recipes

echo
echo "== 3. variables and task graph"
printf '\n$ bitbake -e vlad | grep -E "^(SRC_URI|FILES:vlad)="   (crate list cut)\n'
bitbake -e vlad | grep -E '^(SRC_URI|FILES:vlad)=' | tr -s ' ' |
    sed -E 's/((crate:[^ ]+ ){3}).*( crate:[^ ]+ )/\1...\3/'
printf '\n$ bitbake -e vlad | grep -E "^(RDEPENDS:vlad|CARGO_MANIFEST_PATH|CARGO_BUILD_FLAGS|VLA_ADSP_LIBRARY_PATH)="\n'
bitbake -e vlad | grep -E '^(RDEPENDS:vlad|CARGO_MANIFEST_PATH|CARGO_BUILD_FLAGS|VLA_ADSP_LIBRARY_PATH)='
printf '\n$ bitbake -e vla-bundle | grep -E "^(PV|DEPENDS|VLA_BUNDLE_SRC|VLA_BUNDLE_QAIRT_VERSION|VLA_QAIRT_PROVIDER)="\n'
bitbake -e vla-bundle | grep -E '^(PV|DEPENDS|VLA_BUNDLE_SRC|VLA_BUNDLE_QAIRT_VERSION|VLA_QAIRT_PROVIDER)='

# A dry run lists every task it would run (about 1300 for vlad, mostly the toolchain):
# show the count and the layer's own tasks.
printf '\n$ bitbake vlad -n   (layer tasks and total count)\n'
if ! bitbake vlad -n > "$build/vlad-dry-run.log" 2>&1; then
    tail -n 20 "$build/vlad-dry-run.log"
    exit 1
fi
grep -E '^(Parsing of|Sstate summary)' "$build/vlad-dry-run.log" | sed 's/done\.$//' || true
echo "tasks: $(grep -c '^NOTE: Running' "$build/vlad-dry-run.log")"
grep -E '^NOTE: Running.*meta-vla' "$build/vlad-dry-run.log" |
    sed -E 's/.*meta-vla\/recipes-vla\/[^/]+\///; s/\)$//' | tr '\n' ' ' | fold -s -w 100
echo

# The image's whole task graph without running it (a dry run would walk thousands of tasks).
run bitbake -g vla-image
printf '\n$ grep the layer'"'"'s edges in task-depends.dot\n'
grep -oE '"(vla-image|packagegroup-vla|vla-bundle|vlad)\.do_[a-z_]+" -> "(vlad|vla-bundle|qairt-local|packagegroup-vla)\.do_[a-z_]+"' \
    task-depends.dot | sort -u | sed -n 1,20p

# The bundle check that runs at build time (it reads only the bundle directory).
run bitbake vla-bundle -c verify_bundle

echo
echo "== 4. VLA_QAIRT_PROVIDER = qairt-wheel: QAIRT's device side from the pinned public wheel"
echo 'VLA_QAIRT_PROVIDER = "qairt-wheel"' >> conf/vla.conf
run bitbake -p
printf '\n$ bitbake-layers show-recipes | grep -A1 vla   (Qualcomm license not accepted yet)\n'
vla_recipes
echo 'LICENSE_FLAGS_ACCEPTED += "qcom-ai-stack"' >> conf/vla.conf
printf '\n+ LICENSE_FLAGS_ACCEPTED += "qcom-ai-stack"\n'
run bitbake -p
printf '\n$ bitbake-layers show-recipes | grep -A1 vla\n'
vla_recipes
printf '\n$ bitbake -e qairt-wheel | grep -E "^(PV|LICENSE|LICENSE_FLAGS|LIC_FILES_CHKSUM|SRC_URI|S|FILES:qairt-wheel|FILES:qairt-wheel-hexagon-v73|RCONFLICTS:qairt-wheel)="\n'
bitbake -e qairt-wheel | grep -E '^(PV|LICENSE|LICENSE_FLAGS|LIC_FILES_CHKSUM|SRC_URI|S|FILES:qairt-wheel|FILES:qairt-wheel-hexagon-v73|RCONFLICTS:qairt-wheel)=' |
    tr -s ' '
printf '\n$ bitbake -e vlad | grep -E "^(RDEPENDS:vlad|VLA_ADSP_LIBRARY_PATH)="\n'
bitbake -e vlad | grep -E '^(RDEPENDS:vlad|VLA_ADSP_LIBRARY_PATH)='
printf '\n$ bitbake -e vla-image | grep ^BAD_RECOMMENDATIONS=\n'
bitbake -e vla-image | grep '^BAD_RECOMMENDATIONS='
# The fetch for real, offline: the wheel scripts/fetch_qairt_aarch64.sh downloaded (with
# pip, SHA-256 checked) is put where the fetcher looks, and do_fetch checks it against
# the recipe's pinned sha256.
wheel_file="$(sed -n 's/^QAIRT_WHEEL_FILE = "\(.*\)"$/\1/p' "$layer"/recipes-vla/qairt-wheel/qairt-wheel_*.bb)"
"$repo_root/scripts/fetch_qairt_aarch64.sh" >/dev/null
mkdir -p "$build/downloads"
cp "$repo_root/build/wheels/$wheel_file" "$build/downloads/$wheel_file.zip"
rm -f "$build/downloads/$wheel_file.zip.done"
run bitbake qairt-wheel -c fetch
run bitbake -g vla-image
printf '\n$ grep the provider'"'"'s edges in task-depends.dot\n'
grep -oE '"(vlad|vla-bundle)\.do_[a-z_]+" -> "qairt-wheel\.do_[a-z_]+"' task-depends.dot | sort -u | sed -n 1,10p

if [[ -n "${META_RAUC:-}" ]]; then
    echo
    echo "== 5. meta-rauc present: the policy as a RAUC artifact (dynamic-layers/rauc)"
    printf '\n$ bitbake -e vla-rauc | grep -E "^(RDEPENDS:vla-rauc|FILES:vla-rauc)="\n'
    bitbake -e vla-rauc | grep -E '^(RDEPENDS:vla-rauc|FILES:vla-rauc)='
    printf '\n$ bitbake -e rauc-conf | sed -n "/^do_install() {/,/^}/p"\n'
    bitbake -e rauc-conf | sed -n '/^do_install() {/,/^}/p'
    printf '\n$ bitbake -e vla-policy-update | grep -E "^(RAUC_BUNDLE_SLOTS|RAUC_BUNDLE_FORMAT|RAUC_SLOT_vla-policies/policy)"\n'
    bitbake -e vla-policy-update | grep -E '^(RAUC_BUNDLE_SLOTS|RAUC_BUNDLE_FORMAT|RAUC_SLOT_vla-policies/policy)='
    run bitbake -g vla-policy-update
    printf '\n$ grep the bundle'"'"'s edge to vla-bundle in task-depends.dot\n'
    grep -oE '"vla-policy-update\.do_[a-z_]+" -> "vla-bundle\.do_[a-z_]+"' task-depends.dot | sort -u
    # The tar the RAUC bundle carries (reads only the bundle directory).
    run bitbake vla-bundle -c deploy
    tar -tvf "$build/tmp/deploy/images/$machine/vla-policy-molmoact2-libero-original-tiny.tar"
    # The fleet agent: meta-rauc's rauc-hawkbit-updater with meta-vla's append, pulled in
    # by packagegroup-vla.
    printf '\n$ bitbake -e packagegroup-vla | grep ^RDEPENDS:packagegroup-vla=\n'
    bitbake -e packagegroup-vla | grep '^RDEPENDS:packagegroup-vla='
    printf '\n$ bitbake -e rauc-hawkbit-updater | grep -E "^(PV|VLA_HAWKBIT_DIR|VLA_HAWKBIT_VLA|SRC_URI|FILES:rauc-hawkbit-updater|SYSTEMD_SERVICE:rauc-hawkbit-updater)="\n'
    bitbake -e rauc-hawkbit-updater |
        grep -E '^(PV|VLA_HAWKBIT_DIR|VLA_HAWKBIT_VLA|SRC_URI|FILES:rauc-hawkbit-updater|SYSTEMD_SERVICE:rauc-hawkbit-updater)='
    printf '\n$ bitbake -e rauc-hawkbit-updater | sed -n "/^do_install() {/,/^}/p"   (the append)\n'
    bitbake -e rauc-hawkbit-updater | sed -n '/^do_install() {/,/^}/p' | grep -A30 'VLA_HAWKBIT\|vla-hawkbit' | head -30
    run bitbake -g vla-image
    printf '\n$ grep rauc-hawkbit-updater'"'"'s edges in task-depends.dot\n'
    grep -oE '"(vla-image|packagegroup-vla)\.do_[a-z_]+" -> "(rauc-hawkbit-updater|vla-rauc)\.do_[a-z_]+"' \
        task-depends.dot | sort -u
fi
