#!/usr/bin/env bash
# Builds the release vlad for x86_64 and aarch64 and checks that its only dynamic
# dependencies are glibc's (all Rust code and GCC's unwinder are linked statically; QNN is
# dlopen'ed).
set -euo pipefail
repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"
allowed='^(libc\.so\.6|libm\.so\.6|libdl\.so\.2|libpthread\.so\.0|librt\.so\.1|ld-linux-aarch64\.so\.1|ld-linux-x86-64\.so\.2)$'
status=0
for target in x86_64-unknown-linux-gnu aarch64-unknown-linux-gnu; do
    cargo build --release --locked -p vlad --target "$target" >/dev/null 2>&1 ||
        cargo build --release --locked -p vlad --target "$target"
    bin="target/$target/release/vlad"
    needed=$(readelf -d "$bin" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
    size=$(stat -c %s "$bin")
    echo "$target: $bin $size bytes; NEEDED: $(echo $needed | tr '\n' ' ')"
    for lib in $needed; do
        if ! [[ $lib =~ $allowed ]]; then
            echo "check_release: $target links $lib, which is not part of glibc" >&2
            status=1
        fi
    done
done
exit $status
