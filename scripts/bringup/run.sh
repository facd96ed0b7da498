#!/usr/bin/env bash
# Board bring-up in one command: deploys vlad and a policy bundle to an IQ-9075 (or any
# SSH target) in a temporary workspace, checks the rings' shared memory there with
# vla-ring-bridge (the C ring client library, runtime/ring-c, built for the target's
# architecture), proves parity on its NPU, runs the benchmark,
# brings the JSON results and logs back, removes the workspace and writes a Markdown
# report with plots. Large files are uploaded once and kept on the target by content hash.
#
# usage: scripts/bringup/run.sh --target USER@HOST --vlad PATH --bundle DIR --out DIR [options]
#   --port N                SSH port (default 22)
#   --identity FILE         private key for the target
#   --password-file FILE    file holding the password (used through sshpass)
#   --known-hosts FILE      known_hosts file to use (default: ssh's own)
#   --qnn-lib-dir DIR       QAIRT aarch64 library dir on the target (default: /usr/lib,
#                           where the image installs QAIRT)
#   --dsp-lib-dir DIR       dir of libQnnHtpV73Skel.so on the target (default: the image's
#                           /usr/lib/rfsa/adsp, /usr/lib/dsp, .../dsp/cdsp)
#   --qnn-local-dir DIR     local QAIRT library dir to upload instead (its *.so files)
#   --dsp-local-dir DIR     local hexagon-v73 skel dir to upload instead (its *.so files)
#   --qairt-wheel           upload the QAIRT libraries and the v73 skel from the pinned
#                           public wheel (scripts/fetch_qairt_aarch64.sh): for a board
#                           without QAIRT, no SDK download needed
#   --remote-dir DIR        cache and workspaces on the target (default ~/.cache/vla-bringup)
#   --remote-min-free MIB   free space to leave on the target after uploading (default 64)
#   --iterations N          benchmark iterations (default 50)
#   --observations DIR      more observations to measure parity on: DIR/<name>/ holds goldens
#                           laid out as the bundle's (golden/<c>_io.npz, golden/end_to_end.npz;
#                           scripts/bringup/observation_goldens.py makes them); vlad parity runs
#                           once more per <name> on the bundle with those goldens, and the
#                           report's gates.json takes the minimum over every run
#   --dsp-probe-runs N      executes per context in the DSP memory probe (`vlad dsp-probe`:
#                           contexts one by one into one process, then as the memory plan
#                           places them; default 20, 0 skips it)
#   --shared-ab on|off      also run every context with client buffers and with HTP shared
#                           buffers (`vlad bench-context [--shared-buffers]`, N iterations
#                           each), and the whole bundle with `vlad bench-bundle
#                           --shared-buffers`, for the report's A/B (default on)
# Exit codes: 0 parity passed, 3 parity gate failed (report still written), 1 any error,
# 2 bad command line.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo_root="$(cd "$here/../.." && pwd)"
prog="bringup"

die() {
    printf '%s: %s\n' "$prog" "$*" >&2
    exit 1
}
usage_error() {
    printf '%s: %s\n(see the header of %s for the options)\n' "$prog" "$*" "$0" >&2
    exit 2
}
note() { printf '%s: %s\n' "$prog" "$*" >&2; }

target="" port=22 identity="" password_file="" known_hosts=""
vlad="" bundle="" out=""
qnn_lib_dir="" dsp_lib_dir="" qnn_local_dir="" dsp_local_dir="" qairt_wheel=0
remote_dir="" min_free_mib=64 iterations=50 observations="" probe_runs=20 shared_ab=on
while (($#)); do
    opt=$1
    case "$opt" in
        -h | --help)
            sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
            exit 0
            ;;
        --qairt-wheel)
            qairt_wheel=1
            shift
            continue
            ;;
    esac
    (($# >= 2)) || usage_error "$opt needs a value"
    case "$opt" in
        --target) target=$2 ;;
        --port) port=$2 ;;
        --identity) identity=$2 ;;
        --password-file) password_file=$2 ;;
        --known-hosts) known_hosts=$2 ;;
        --vlad) vlad=$2 ;;
        --bundle) bundle=$2 ;;
        --out) out=$2 ;;
        --qnn-lib-dir) qnn_lib_dir=$2 ;;
        --dsp-lib-dir) dsp_lib_dir=$2 ;;
        --qnn-local-dir) qnn_local_dir=$2 ;;
        --dsp-local-dir) dsp_local_dir=$2 ;;
        --remote-dir) remote_dir=$2 ;;
        --remote-min-free) min_free_mib=$2 ;;
        --iterations) iterations=$2 ;;
        --observations) observations=$2 ;;
        --dsp-probe-runs) probe_runs=$2 ;;
        --shared-ab) shared_ab=$2 ;;
        *) usage_error "unknown option $opt" ;;
    esac
    shift 2
done

[[ -n $target ]] || usage_error "--target USER@HOST is required"
[[ -n $vlad ]] || usage_error "--vlad PATH is required"
[[ -n $bundle ]] || usage_error "--bundle DIR is required"
[[ -n $out ]] || usage_error "--out DIR is required"
[[ $port =~ ^[0-9]+$ ]] || usage_error "--port: '$port' is not a port number"
[[ $iterations =~ ^[1-9][0-9]*$ ]] || usage_error "--iterations: '$iterations' is not a positive number"
[[ $probe_runs =~ ^[0-9]+$ ]] || usage_error "--dsp-probe-runs: '$probe_runs' is not a number"
[[ $shared_ab == on || $shared_ab == off ]] || usage_error "--shared-ab: '$shared_ab' is not on or off"
[[ $min_free_mib =~ ^[0-9]+$ ]] || usage_error "--remote-min-free: '$min_free_mib' is not a number of MiB"
[[ -z $identity || -z $password_file ]] || usage_error "give --identity or --password-file, not both"
[[ -z $qnn_lib_dir || -z $qnn_local_dir ]] || usage_error "give --qnn-lib-dir or --qnn-local-dir, not both"
[[ -z $dsp_lib_dir || -z $dsp_local_dir ]] || usage_error "give --dsp-lib-dir or --dsp-local-dir, not both"
if ((qairt_wheel)); then
    [[ -z $qnn_lib_dir$qnn_local_dir$dsp_lib_dir$dsp_local_dir ]] ||
        usage_error "--qairt-wheel brings its own QAIRT and skel: drop --qnn-*-dir / --dsp-*-dir"
fi

# Credentials come only from files the user names, never from the repository: a key or
# password inside the work tree is one `git add` away from being published.
check_secret_file() {
    local what=$1 file=$2 real
    [[ -f $file && -r $file ]] || die "$what $file: no such readable file"
    real="$(realpath "$file")"
    case "$real/" in
        "$repo_root"/*) die "$what $file is inside the repository ($repo_root); keep credentials outside it" ;;
    esac
    if (((8#$(stat -c %a "$real") & 8#077) != 0)); then
        note "warning: $what $file is readable by other users (chmod 600 it)"
    fi
}
[[ -z $identity ]] || check_secret_file "--identity" "$identity"
[[ -z $password_file ]] || check_secret_file "--password-file" "$password_file"
if [[ -n $password_file ]] && ! command -v sshpass >/dev/null; then
    die "--password-file needs sshpass (apt-get install sshpass)"
fi

[[ -f $vlad ]] || die "--vlad $vlad: no such file"
[[ -f $bundle/bundle.json ]] || die "--bundle $bundle: no bundle.json there"
[[ -z $observations || -d $observations ]] || die "--observations $observations: no such directory"
if ((qairt_wheel)); then
    # QAIRT's device side from the public wheel (pinned by SHA-256), unpacked into build/.
    wheel_dir="$("$repo_root/scripts/fetch_qairt_aarch64.sh")" ||
        die "--qairt-wheel: could not fetch the QAIRT libraries (scripts/fetch_qairt_aarch64.sh)"
    qnn_local_dir="$wheel_dir/lib"
    dsp_local_dir="$wheel_dir/dsp"
    note "QAIRT $(cat "$wheel_dir/qairt-version") from the wheel: $qnn_local_dir, $dsp_local_dir"
fi
for d in "$qnn_local_dir" "$dsp_local_dir"; do
    [[ -z $d || -d $d ]] || die "local library dir $d: no such directory"
done

# ELF e_machine, spelled like `uname -m`.
elf_arch() {
    local file=$1 magic machine
    magic="$(od -An -c -N4 "$file" 2>/dev/null | tr -d ' ')"
    [[ $magic == '177ELF' ]] || return 0
    machine="$(od -An -tu2 -j18 -N2 "$file" | tr -d ' ')"
    case "$machine" in
        62) echo x86_64 ;;
        183) echo aarch64 ;;
        *) echo "elf-machine-$machine" ;;
    esac
}
vlad_arch="$(elf_arch "$vlad")"
[[ -n $vlad_arch ]] || die "--vlad $vlad is not an ELF executable"

work="$(mktemp -d "${TMPDIR:-/tmp}/vla-bringup.XXXXXX")"
ssh_opts=(-p "$port" -o ConnectTimeout=10 -o ServerAliveInterval=15 -o ServerAliveCountMax=4
    -o StrictHostKeyChecking=accept-new -o LogLevel=ERROR
    -o ControlMaster=auto -o "ControlPath=$work/cm" -o ControlPersist=300)
[[ -z $known_hosts ]] || ssh_opts+=(-o "UserKnownHostsFile=$known_hosts")
ssh_cmd=(ssh)
if [[ -n $password_file ]]; then
    ssh_cmd=(sshpass -f "$password_file" ssh)
    ssh_opts+=(-o PreferredAuthentications=password,keyboard-interactive
        -o PubkeyAuthentication=no -o NumberOfPasswordPrompts=1)
else
    ssh_opts+=(-o BatchMode=yes)
    [[ -z $identity ]] || ssh_opts+=(-i "$identity" -o IdentitiesOnly=yes)
fi

workspace=""
finish() {
    local rc=$?
    if [[ -n $workspace ]]; then
        # The workspace goes even when the run failed half-way; the cache stays.
        if out_cleanup="$(remote cleanup "$workspace" 2>&1)"; then
            grep -q '^removed=' <<<"$out_cleanup" ||
                note "warning: could not remove $workspace on $target: $out_cleanup"
        else
            note "warning: could not remove $workspace on $target (remove it by hand)"
        fi
    fi
    ssh -o "ControlPath=$work/cm" -O exit "$target" >/dev/null 2>&1 || true
    rm -rf "$work"
    exit "$rc"
}
trap finish EXIT
trap 'exit 130' INT TERM

# Single-quotes one word for the target's shell.
q() { printf "'%s'" "${1//\'/\'\\\'\'}"; }

# Explains an ssh failure in one line (ssh's own message is kept as the reason).
ssh_failure() {
    local rc=$1 err=$2 reason
    reason="$(grep -v '^\s*$' <<<"$err" | tail -n 1)"
    if [[ -n $password_file && $rc -eq 5 ]]; then
        die "authentication failed for $target: the password in $password_file was refused"
    elif [[ -n $password_file && $rc -eq 6 ]]; then
        die "host key of $target is not known; connect once by hand or use --known-hosts"
    fi
    case "$err" in
        *"Connection refused"* | *"timed out"* | *"No route to host"* | *"Could not resolve"* | \
            *"Network is unreachable"* | *"Connection closed by"* | *"Connection reset"*)
            die "cannot reach $target on port $port: $reason" ;;
        *"Permission denied"*)
            [[ -z $password_file ]] ||
                die "authentication failed for $target: the password in $password_file was refused ($reason)"
            die "authentication failed for $target${identity:+ with key $identity}: $reason" ;;
        *"Host key verification failed"* | *"REMOTE HOST IDENTIFICATION HAS CHANGED"*)
            die "host key of $target does not match the known one: $reason" ;;
        *"No space left on device"* | *"Disk quota exceeded"*)
            die "the target's disk is full: $reason" ;;
    esac
    die "ssh to $target failed (exit $rc): $reason"
}

# Runs one step of remote.sh on the target; its key=value output goes to stdout.
remote() {
    local args="" a
    for a in "$@"; do args+=" $(q "$a")"; done
    "${ssh_cmd[@]}" "${ssh_opts[@]}" "$target" "sh -s --$args" <"$here/remote.sh"
}

# Like remote(), but dies with a readable reason when ssh itself fails.
remote_checked() {
    local rc=0
    "$@" >"$work/step.out" 2>"$work/step.err" || rc=$?
    if ((rc != 0)); then
        ssh_failure "$rc" "$(cat "$work/step.err")"
    fi
    cat "$work/step.err" >&2
    if grep -q '^error=' "$work/step.out"; then
        die "on $target: $(sed -n 's/^error=//p' "$work/step.out" | head -n 1)"
    fi
    cat "$work/step.out"
}
field() { sed -n "s/^$1=//p" <<<"$2" | head -n 1; }
fields() { sed -n "s/^$1=//p" <<<"$2"; }

# --- what to deploy: every file lands in the target's cache under its sha256 -------------
manifest="$work/manifest" # lines: sha256 mode size workspace-path local-path
: >"$manifest"
declare -A hashed # local path -> sha256: a bundle file deployed once per observation is hashed once
add_file() {
    local local_path=$1 ws_path=$2 mode=$3 hash size
    [[ $ws_path != *[[:space:]]* ]] || die "$local_path: file names with whitespace are not supported"
    hash=${hashed[$local_path]:-}
    [[ -n $hash ]] || hash="$(sha256sum "$local_path" | cut -d' ' -f1)"
    hashed[$local_path]=$hash
    size="$(stat -L -c %s "$local_path")"
    printf '%s %s %s %s %s\n' "$hash" "$mode" "$size" "$ws_path" "$local_path" >>"$manifest"
}
add_libs() {
    local dir=$1 prefix=$2 f found=0
    while IFS= read -r f; do
        add_file "$f" "$prefix/$(basename "$f")" r
        found=1
    done < <(find -L "$dir" -maxdepth 1 -type f -name '*.so*' | sort)
    ((found)) || die "$dir holds no *.so files"
}
# The ring bridge for the target's architecture, from the C ring client library (its
# Makefile; x86_64 with cc, aarch64 with Debian's cross gcc, statically linked): the
# target's ring check. Without a compiler for that architecture the check is skipped.
ring_bridge=""
if make -s -C "$repo_root/runtime/ring-c" ARCH="$vlad_arch" >"$work/ring-c.log" 2>&1; then
    ring_bridge="$repo_root/build/ring-c/$vlad_arch/vla-ring-bridge"
else
    note "no vla-ring-bridge for $vlad_arch (make -C runtime/ring-c ARCH=$vlad_arch: $(tail -n 1 "$work/ring-c.log")); the ring check is skipped"
fi

note "hashing what to deploy"
add_file "$vlad" vlad x
[[ -z $ring_bridge ]] || add_file "$ring_bridge" vla-ring-bridge x
while IFS= read -r f; do
    add_file "$f" "bundle/${f#"$bundle"/}" r
done < <(find -L "$bundle" -type f | sort)
# Each observation: the bundle again (the same blobs, linked from the target's cache, so
# nothing is uploaded twice) with the observation's goldens in place of the release's.
if [[ -n $observations ]]; then
    found_obs=0
    for obs in "$observations"/*/; do
        obs=${obs%/}
        name=$(basename "$obs")
        [[ $name =~ ^[A-Za-z0-9_.-]+$ ]] || die "--observations: $obs: name it with letters, digits, _ . - only"
        while IFS= read -r f; do
            rel=${f#"$obs"/}
            [[ -f $bundle/$rel ]] || die "--observations: $f replaces no file of the bundle ($bundle/$rel)"
        done < <(find -L "$obs" -type f | sort)
        while IFS= read -r f; do
            rel=${f#"$bundle"/}
            if [[ -f $obs/$rel ]]; then src=$obs/$rel; else src=$f; fi
            add_file "$src" "observations/$name/$rel" r
        done < <(find -L "$bundle" -type f | sort)
        found_obs=$((found_obs + 1))
    done
    ((found_obs)) || die "--observations $observations holds no observation directory"
    note "$found_obs more observation(s) from $observations"
fi
if [[ -n $qnn_local_dir ]]; then
    for lib in libQnnHtp.so libQnnSystem.so; do
        [[ -f $qnn_local_dir/$lib ]] || die "QAIRT libraries missing: --qnn-local-dir $qnn_local_dir has no $lib"
    done
    lib_arch="$(elf_arch "$qnn_local_dir/libQnnHtp.so")"
    [[ $lib_arch == "$vlad_arch" ]] ||
        die "QAIRT libraries in $qnn_local_dir are $lib_arch but --vlad $vlad is $vlad_arch"
    add_libs "$qnn_local_dir" qnn
fi
if [[ -n $dsp_local_dir ]]; then
    [[ -f $dsp_local_dir/libQnnHtpV73Skel.so ]] ||
        die "QAIRT DSP libraries missing: --dsp-local-dir $dsp_local_dir has no libQnnHtpV73Skel.so"
    add_libs "$dsp_local_dir" dsp
fi

# --- probe: reachability, architecture, QAIRT, disk ------------------------------------
# An uploaded QAIRT dir was checked above; the probe checks a dir already on the target.
probe_qnn_dir=""
[[ -n $qnn_local_dir ]] || probe_qnn_dir=${qnn_lib_dir:-/usr/lib}
image_dsp_dirs="/usr/lib/rfsa/adsp;/usr/lib/dsp;/usr/share/qcom/sa8775p/Qualcomm/SA8775P-RIDE/dsp/cdsp"
probe_dsp_dirs=${dsp_lib_dir:-$image_dsp_dirs}
note "probing $target (port $port)"
mapfile -t hashes < <(cut -d' ' -f1 "$manifest" | sort -u)
facts="$(remote_checked remote probe "$remote_dir" "$probe_qnn_dir" \
    "$([[ -n $dsp_local_dir ]] && echo "" || echo "$probe_dsp_dirs")" "${hashes[@]}")"

for tool in $(fields missing_tool "$facts"); do
    die "the target has no $tool (needed to receive and check files)"
done
remote_arch="$(field arch "$facts")"
if [[ $remote_arch != "$vlad_arch" ]]; then
    hint=""
    [[ $remote_arch == aarch64 ]] && hint="; build it with cargo build --release -p vlad --target aarch64-unknown-linux-gnu"
    die "wrong architecture: --vlad $vlad is a $vlad_arch binary but $target is $remote_arch (uname -m)$hint"
fi
if [[ -z $qnn_local_dir ]]; then
    [[ -z $(field qnn_dir_missing "$facts") ]] ||
        die "QAIRT libraries missing: $probe_qnn_dir does not exist on $target (give --qnn-lib-dir, --qnn-local-dir or --qairt-wheel)"
    missing_libs="$(fields qnn_lib_missing "$facts" | tr '\n' ' ')"
    [[ -z $missing_libs ]] ||
        die "QAIRT libraries missing: $probe_qnn_dir on $target has no ${missing_libs% } (give --qnn-lib-dir, --qnn-local-dir or --qairt-wheel)"
    qnn_arch="$(field qnn_arch "$facts")"
    [[ -z $qnn_arch || $qnn_arch == "$remote_arch" ]] ||
        die "QAIRT libraries in $probe_qnn_dir on $target are $qnn_arch, the target is $remote_arch"
fi
if [[ -z $dsp_local_dir && $remote_arch == aarch64 && -n $(field skel_missing "$facts") ]]; then
    die "QAIRT DSP libraries missing: no libQnnHtpV73Skel.so in ${probe_dsp_dirs//;/ or } on $target (give --dsp-lib-dir, --dsp-local-dir or --qairt-wheel)"
fi

base="$(field base "$facts")"
free_kib="$(field free_kib "$facts")"
[[ -n $base && $free_kib =~ ^[0-9]+$ ]] || die "the target did not report its cache directory and free space"
mapfile -t missing < <(fields missing "$facts")
declare -A is_missing=()
for h in "${missing[@]}"; do is_missing[$h]=1; done
upload_bytes=0
upload_dir="$work/upload"
mkdir -p "$upload_dir"
while read -r hash _ size _ local_path; do
    if [[ -n ${is_missing[$hash]:-} && ! -e $upload_dir/$hash ]]; then
        ln -s "$(realpath "$local_path")" "$upload_dir/$hash"
        upload_bytes=$((upload_bytes + size))
    fi
done <"$manifest"
need_kib=$(((upload_bytes + 1023) / 1024 + min_free_mib * 1024))
if ((free_kib < need_kib)); then
    die "the target's disk is too full: $((free_kib / 1024)) MiB free in $base, need $((need_kib / 1024)) MiB ($((upload_bytes / 1048576)) MiB to upload + --remote-min-free $min_free_mib MiB)"
fi
cached_count=$(($(wc -l <"$manifest") - ${#missing[@]}))
note "target $(field hostname "$facts"): $remote_arch, $(field os "$facts"), $((free_kib / 1024)) MiB free in $base"
note "deploying: ${#missing[@]} files to upload ($((upload_bytes / 1024)) KiB), $cached_count already cached"

# --- upload, link, run, collect ------------------------------------------------------
workspace="$base/run.$(date -u +%Y%m%dT%H%M%SZ).$$.$RANDOM"
if ((${#missing[@]})); then
    rc=0
    tar -c -h -C "$upload_dir" . 2>"$work/tar.err" |
        "${ssh_cmd[@]}" "${ssh_opts[@]}" "$target" \
            "mkdir -p $(q "$workspace/incoming") && tar -x -o -C $(q "$workspace/incoming")" \
            2>"$work/upload.err" || rc=$?
    if ((rc != 0)); then
        [[ ! -s $work/tar.err ]] || die "packing the upload failed: $(tail -n 1 "$work/tar.err")"
        ssh_failure "$rc" "$(cat "$work/upload.err")"
    fi
fi
link_args=()
while read -r hash mode _ ws_path _; do
    link_args+=("$hash" "$mode" "$ws_path")
done <"$manifest"
remote_checked remote link "$base" "$workspace" "${link_args[@]}" >/dev/null

if [[ -n $qnn_local_dir ]]; then run_qnn_dir="$workspace/qnn"; else run_qnn_dir=$probe_qnn_dir; fi
if [[ -n $dsp_local_dir ]]; then
    adsp_path="$workspace/dsp"
else
    adsp_path=$probe_dsp_dirs
fi
note "running parity and the benchmark ($iterations iterations) on $target"
status="$(remote_checked remote run "$workspace" "$run_qnn_dir" "$adsp_path" "$iterations" "$probe_runs" "$shared_ab")"

mkdir -p "$out"
raw="$out/raw"
rm -rf "$raw"
mkdir -p "$raw"
rc=0
"${ssh_cmd[@]}" "${ssh_opts[@]}" "$target" "tar -c -C $(q "$workspace/results") ." 2>"$work/collect.err" |
    tar -x -C "$raw" || rc=$?
((rc == 0)) || ssh_failure "$rc" "$(cat "$work/collect.err")"

cleaned="$(remote_checked remote cleanup "$workspace")"
[[ -n $(field removed "$cleaned") ]] || die "could not remove $workspace on $target"
workspace=""
printf 'workspace_removed=yes\nuploaded_files=%s\nuploaded_bytes=%s\ncached_files=%s\n' \
    "${#missing[@]}" "$upload_bytes" "$cached_count" >>"$raw/target.env"
note "results in $raw; workspace removed"

# --- report --------------------------------------------------------------------------
python="$repo_root/.venv/bin/python"
if ! "$python" -c 'import matplotlib' 2>/dev/null; then
    note "setting up the project venv for the report (scripts/setup_python.sh)"
    "$repo_root/scripts/setup_python.sh" >/dev/null
fi
"$python" "$here/report.py" --results "$raw" --bundle "$bundle" --target "$target" --out "$out"
note "report: $out/report.md"

parity_exit="$(field parity_exit "$status")"
case "$parity_exit" in
    0) exit 0 ;;
    3) note "parity gate FAILED on $target (see $out/report.md)"; exit 3 ;;
    *) note "vlad parity did not finish on $target (exit $parity_exit; see $raw/parity.log)"; exit 1 ;;
esac
