#!/usr/bin/env bash
# CI checks for the meta-vla layer and the systemd units, offline apart from PyPI and
# Debian's archive (no bitbake, no layer checkouts):
#   1. oelint-adv over every recipe, include and conf file of meta-vla/;
#   2. systemd-analyze verify over systemd/*.service|*.timer;
#   3. systemd-tmpfiles --create of systemd/vla-tmpfiles.conf into a scratch root;
#   4. scripts/gen_crates_inc.py --check (vlad-crates.inc matches Cargo.lock) and its tests;
#   5. the fleet agent's files (dynamic-layers/rauc/recipes-support/rauc-hawkbit-updater):
#      its service drop-in verified on a stand-in of meta-rauc's unit next to vlad.service,
#      its tmpfiles.d into a scratch root, its configuration script's tests, and its fleet-CA
#      bind made in a private mount namespace in front of this machine's curl;
#   6. scripts/check_recipe_install.py: the recipes' real do_install into a scratch ${D}
#      (every SYSTEMD_SERVICE unit installed, the installed tree as expected, a published
#      signing key refused at build time, the ring client library compiled for aarch64 by
#      its recipe's do_compile); builds target/release/vlad first.
# Prints one PASS/FAIL line per check and exits non-zero if any failed.
# A real bitbake parse of the layer is scripts/bitbake_parse.sh (needs layer checkouts).
set -uo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"

# The linter lives in its own venv: the project venv (.venv) pins the ML tooling and is
# rebuilt from scripts/requirements.txt alone. build/ is ignored by git.
lint_venv="$repo_root/build/oelint-venv"
lint_requirements="$repo_root/scripts/oelint/requirements.txt"
# systemd-analyze and systemd-tmpfiles from Debian bookworm's systemd 252: the oldest unit
# parser we verify against (wrynose ships 259, which knows every directive 252 knows).
systemd_pin="252.*"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

declare -a results=()
failed=0
record() { # name status
    results+=("$2  $1")
    if [[ "$2" != PASS ]]; then failed=1; fi
}

say() { printf '\n== %s\n' "$*"; }

install_oelint() {
    local want stamp="$lint_venv/.requirements.sha256"
    want="$(sha256sum "$lint_requirements" | cut -d' ' -f1)"
    if [[ ! -x "$lint_venv/bin/python" ]]; then
        python3 -m venv "$lint_venv" || return 1
    fi
    if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$want" ]]; then
        "$lint_venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-input \
            -r "$lint_requirements" || return 1
        echo "$want" > "$stamp"
    fi
}

install_systemd_tools() {
    if command -v systemd-analyze >/dev/null && command -v systemd-tmpfiles >/dev/null; then
        return 0
    fi
    if ! command -v apt-get >/dev/null; then
        echo "check_layer: systemd-analyze is missing and apt-get is not available" >&2
        return 1
    fi
    DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            "systemd=$systemd_pin" >/dev/null
}

check_oelint() {
    say "oelint-adv --release wrynose"
    if ! install_oelint; then
        echo "check_layer: could not install oelint-adv from $lint_requirements" >&2
        return 1
    fi
    local -a files
    mapfile -t files < <(find meta-vla \( -name '*.bb' -o -name '*.bbappend' -o -name '*.inc' \
        -o -name '*.conf' -o -name '*.bbclass' \) -type f | sort)
    echo "${#files[@]} files: ${files[*]}"
    # Layer-wide suppressions (per-line ones are justified next to the line):
    # - homepageping: pings HOMEPAGE over the network; CI is offline.
    # - bbclassextend: every recipe is target-only (a device daemon, NPU libraries, a
    #   data bundle, an image); native/nativesdk variants would make no sense.
    # - suggestedvar.CVE_PRODUCT: none of these components has a CPE product of its own;
    #   cve-check falls back to the recipe name.
    # The constants file declares the layer's own variables (VLA_*, QAIRT_*) as known.
    "$lint_venv/bin/oelint-adv" --quiet --release wrynose --relpaths \
        --suppress oelint.vars.homepageping \
        --suppress oelint.var.bbclassextend \
        --suppress oelint.var.suggestedvar.CVE_PRODUCT \
        --constantmods="+$repo_root/scripts/oelint/constants.json" \
        "${files[@]}"
}

check_units() {
    say "systemd-analyze verify"
    install_systemd_tools || return 1
    systemd-analyze --version | head -n 1
    # verify refuses a unit whose ExecStart binary does not exist, and /usr/bin/vlad is
    # not installed on a CI machine: verify copies whose /usr/bin/vlad is a stub script in
    # a scratch directory, so every other line (arguments, /bin/kill, /bin/systemctl)
    # is checked as written. The copies keep their names: OnFailure=, Requisite= and the
    # timer's service resolve among them.
    local units="$work/units" unit out
    mkdir -p "$units/bin"
    printf '#!/bin/sh\nexit 0\n' > "$units/bin/vlad"
    chmod 0755 "$units/bin/vlad"
    local -a unit_files
    mapfile -t unit_files < <(find systemd -maxdepth 1 -type f \( -name '*.service' -o -name '*.timer' \
        -o -name '*.path' -o -name '*.socket' \) | sort)
    if [[ ${#unit_files[@]} -eq 0 ]]; then
        echo "check_layer: no unit files under systemd/" >&2
        return 1
    fi
    for unit in "${unit_files[@]}"; do
        sed "s|/usr/bin/vlad|$units/bin/vlad|g" "$unit" > "$units/$(basename "$unit")"
    done
    # verify exits 0 on many parse errors ("Failed to parse ..., ignoring"): any output
    # at all is a failure.
    out="$(cd "$units" && systemd-analyze verify --man=no "${unit_files[@]##*/}" 2>&1)"
    local status=$?
    echo "${out:-no findings}"
    [[ $status -eq 0 && -z "$out" ]]
}

check_tmpfiles() {
    say "systemd-tmpfiles --create (scratch root)"
    install_systemd_tools || return 1
    # --root resolves users from the scratch root's /etc, where vla is what useradd makes.
    local root="$work/root" out
    mkdir -p "$root/etc" "$root/dev/shm"
    echo 'vla:x:990:990::/var/lib/vla:/sbin/nologin' > "$root/etc/passwd"
    printf 'vla:x:990:\nvla-robot:x:989:\n' > "$root/etc/group"
    out="$(systemd-tmpfiles --create --root="$root" "$repo_root/systemd/vla-tmpfiles.conf" 2>&1)"
    local status=$?
    echo "${out:-no findings}"
    [[ $status -eq 0 && -z "$out" ]] || return 1
    local path
    for path in /var/lib/vla /var/lib/vla/bundles /dev/shm/vla-obs /dev/shm/vla-act /dev/shm/vla-txt; do
        if [[ ! -e "$root$path" ]]; then
            echo "check_layer: tmpfiles did not create $path" >&2
            return 1
        fi
    done
    stat -c '%A %u:%g %n' "$root/var/lib/vla" "$root/dev/shm/vla-obs" "$root/dev/shm/vla-act" \
        "$root/dev/shm/vla-txt" | sed "s|$root||"
    # The rings' split: the robot's group writes observations and instruction texts and
    # only reads actions.
    [[ "$(stat -c '%a %u:%g' "$root/dev/shm/vla-obs")" == "660 990:989" &&
       "$(stat -c '%a %u:%g' "$root/dev/shm/vla-act")" == "640 990:989" &&
       "$(stat -c '%a %u:%g' "$root/dev/shm/vla-txt")" == "660 990:989" ]] || {
        echo "check_layer: the rings are not vla:vla-robot 0660 (obs, txt) and 0640 (act)" >&2
        return 1
    }
}

check_recipe_install() {
    say "each recipe's do_install into a scratch \${D} (scripts/check_recipe_install.py)"
    # The recipe installs the release binary; in a whole run the later RAUC step builds the
    # same one, so building it here first costs nothing extra.
    cargo build --release --locked -p vlad 2>&1 | tail -1
    python3 scripts/check_recipe_install.py
}

hawkbit_files="meta-vla/dynamic-layers/rauc/recipes-support/rauc-hawkbit-updater/files"
# VLA_HAWKBIT_DIR's default (the rauc-hawkbit-updater bbappend), as the bbappend substitutes it.
hawkbit_dir="/var/lib/rauc-hawkbit-updater"

check_hawkbit() {
    say "rauc-hawkbit-updater: drop-in (systemd-analyze verify), tmpfiles, configuration"
    install_systemd_tools || return 1
    # meta-rauc's unit is not in this repository: a stand-in with its ExecStart and user
    # carries the drop-in, which verify loads from the unit's .d directory (an unknown key
    # or a bad line in it is reported). Binaries are stubs, as for vlad above; vlad.service
    # sits next to it so that After=vlad.service resolves.
    local units="$work/hawkbit-units" out status
    mkdir -p "$units/bin" "$units/rauc-hawkbit-updater.service.d"
    local stub
    for stub in vlad rauc-hawkbit-updater vla-hawkbit-config; do
        printf '#!/bin/sh\nexit 0\n' > "$units/bin/$stub"
        chmod 0755 "$units/bin/$stub"
    done
    sed "s|/usr/bin/vlad|$units/bin/vlad|g" systemd/vlad.service > "$units/vlad.service"
    printf '[Unit]\nDescription=stand-in for meta-rauc rauc-hawkbit-updater.service\n\n[Service]\nUser=rauc-hawkbit\nExecStart=%s -s -c /etc/rauc-hawkbit-updater/config.conf\n' \
        "$units/bin/rauc-hawkbit-updater" > "$units/rauc-hawkbit-updater.service"
    sed -e "s|@VLA_HAWKBIT_DIR@|$hawkbit_dir|g" \
        -e "s|/usr/bin/rauc-hawkbit-updater|$units/bin/rauc-hawkbit-updater|" \
        -e "s|/usr/libexec/vla/vla-hawkbit-config|$units/bin/vla-hawkbit-config|" \
        "$hawkbit_files/vla-hawkbit.service.conf" > "$units/rauc-hawkbit-updater.service.d/50-vla.conf"
    if grep -q '@[A-Z_]*@' "$units/rauc-hawkbit-updater.service.d/50-vla.conf"; then
        echo "check_layer: a placeholder the bbappend does not substitute is left in the drop-in" >&2
        return 1
    fi
    out="$(cd "$units" && SYSTEMD_UNIT_PATH="$units:" systemd-analyze verify --man=no \
        rauc-hawkbit-updater.service vlad.service 2>&1)"
    status=$?
    echo "${out:-no findings}"
    [[ $status -eq 0 && -z "$out" ]] || return 1
    # The fleet's CA alone: the directory the bbappend installs VLA_HAWKBIT_CA into, as
    # ca-certificates.crt, read-only over oe-core curl's compiled-in bundle directory
    # (check_recipe_install.py checks the file lands there).
    grep -qx 'BindReadOnlyPaths=/etc/rauc-hawkbit-updater/fleet-ca:/etc/ssl/certs' \
        "$units/rauc-hawkbit-updater.service.d/50-vla.conf" || {
        echo "check_layer: the drop-in does not bind the fleet CA over /etc/ssl/certs" >&2
        return 1
    }
    # The agent is the device's one network-facing process: its sandbox may not regress
    # past 3.0 (vlad's own units score 1.8-3.0).
    local exposure
    exposure="$(cd "$units" && SYSTEMD_UNIT_PATH="$units:" systemd-analyze security --offline=true \
        rauc-hawkbit-updater.service 2>&1 | sed -n 's/.*Overall exposure level for [^:]*: \([0-9.]*\).*/\1/p')"
    echo "systemd-analyze security --offline=true rauc-hawkbit-updater.service: ${exposure:-no score}"
    awk -v e="${exposure:-99}" 'BEGIN { exit !(e <= 3.0) }' || {
        echo "check_layer: the agent's exposure ${exposure:-?} is above 3.0" >&2
        return 1
    }

    local root="$work/hawkbit-root" conf="$work/vla-hawkbit-tmpfiles.conf"
    mkdir -p "$root/etc"
    echo 'rauc-hawkbit:x:991:991::/:/bin/false' > "$root/etc/passwd"
    echo 'rauc-hawkbit:x:991:' > "$root/etc/group"
    sed "s|@VLA_HAWKBIT_DIR@|$hawkbit_dir|g" "$hawkbit_files/vla-hawkbit-tmpfiles.conf" > "$conf"
    out="$(systemd-tmpfiles --create --root="$root" "$conf" 2>&1)"
    status=$?
    echo "${out:-no findings}"
    [[ $status -eq 0 && -z "$out" ]] || return 1
    [[ "$(stat -c '%a %u' "$root$hawkbit_dir/download")" == "700 991" ]] || {
        echo "check_layer: tmpfiles did not make $hawkbit_dir/download 0700 rauc-hawkbit" >&2
        return 1
    }
    stat -c '%A %u:%g %n' "$root$hawkbit_dir" "$root$hawkbit_dir/download" | sed "s|$root||"

    .venv/bin/python -m pytest -q -p no:cacheprovider scripts/tests/test_vla_hawkbit_config.py \
        scripts/tests/test_hawkbit_fleet_ca.py
}

check_crates() {
    say "gen_crates_inc.py --check"
    python3 -m unittest discover -s scripts/tests -p 'test_gen_crates_inc.py' || return 1
    python3 scripts/gen_crates_inc.py --check
}

run_check() { # name function
    if "$2"; then record "$1" PASS; else record "$1" FAIL; fi
}

run_check "oelint-adv (meta-vla, wrynose)" check_oelint
run_check "systemd-analyze verify (systemd/)" check_units
run_check "systemd-tmpfiles (vla-tmpfiles.conf)" check_tmpfiles
run_check "vlad-crates.inc matches Cargo.lock" check_crates
run_check "rauc-hawkbit-updater drop-in, tmpfiles, configuration" check_hawkbit
run_check "do_install of vlad, vla-ring-client, vla-rauc, rauc-hawkbit-updater (installed tree)" check_recipe_install

printf '\n== summary\n'
printf '%s\n' "${results[@]}"
passed=$(printf '%s\n' "${results[@]}" | grep -c '^PASS' || true)
echo "check_layer: $passed passed, $(( ${#results[@]} - passed )) failed"
if [[ $failed -ne 0 ]]; then
    echo "check_layer: FAIL"
    exit 1
fi
echo "check_layer: PASS"
