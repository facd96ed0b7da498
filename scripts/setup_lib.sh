# Shared by the set-up scripts (sourced, not run): Debian packages installed once, and a
# venv made from a hash-pinned requirements file, remade only when that file changes.

# apt_ensure LABEL PACKAGE...: installs the packages not yet installed (root or sudo).
apt_ensure() {
    local label="$1" p
    shift
    local missing=()
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
    done
    ((${#missing[@]})) || return 0
    echo "$label: installing Debian packages: ${missing[*]}"
    local sudo_cmd=()
    [[ $(id -u) -eq 0 ]] || sudo_cmd=(sudo)
    "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    "${sudo_cmd[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# venv_from_hashes LABEL VENV REQUIREMENTS PYTHON: VENV holds exactly REQUIREMENTS
# (--require-hashes, --no-deps); a stamp of the file's hash skips the install next time.
venv_from_hashes() {
    local label="$1" venv="$2" req="$3" py="$4"
    local stamp="$venv/.requirements.sha256" want
    want="$(sha256sum "$req" | cut -d' ' -f1)"
    [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]] && return 0
    echo "$label: venv $venv from $req"
    [[ -x "$venv/bin/python" ]] || "$py" -m venv "$venv"
    "$venv/bin/pip" install -q --disable-pip-version-check --require-hashes --no-deps -r "$req"
    echo "$want" >"$stamp"
}

# editable_packages LABEL VENV PACKAGE_DIR...: installs the repository's Python packages
# (tools/<package>, each with its pyproject.toml) into VENV in editable mode, so their code is
# the checkout's and their commands (vla-import, ...) are in VENV/bin. Offline: no index, no
# build isolation (the venv's own setuptools builds them), no dependencies (the venv's pinned
# requirements provide those). Redone only when a pyproject.toml or the checkout's path changes.
editable_packages() {
    local label="$1" venv="$2"
    shift 2
    local stamp="$venv/.editable.sha256" want d
    want="$( { for d in "$@"; do echo "$d"; cat "$d/pyproject.toml"; done; } | sha256sum | cut -d' ' -f1)"
    [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]] && return 0
    echo "$label: editable packages in $venv: $*" >&2
    # The pinned venvs' requirements hold setuptools 80.9.0 (it builds wheels itself); the
    # heavy upstream venvs, made online, fetch it here.
    "$venv/bin/python" -c 'import setuptools, sys; sys.exit(int(setuptools.__version__.split(".")[0]) < 71)' 2>/dev/null ||
        "$venv/bin/pip" install -q --disable-pip-version-check "setuptools==80.9.0" >&2
    local args=()
    for d in "$@"; do args+=(-e "$d"); done
    "$venv/bin/pip" install -q --disable-pip-version-check --no-index --no-deps --no-build-isolation "${args[@]}" >&2
    echo "$want" >"$stamp"
}
