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
