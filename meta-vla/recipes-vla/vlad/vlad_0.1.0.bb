SUMMARY = "VLA policy runtime daemon for the Hexagon NPU (QNN HTP)"
DESCRIPTION = "vlad runs vision-language-action policies from prebuilt QNN HTP context \
               binaries on Qualcomm IQ-9075, publishing action chunks to a shared-memory \
               ring at a fixed rate, and installs, activates, commits and rolls back \
               policy bundles over the air."
HOMEPAGE = "https://example.invalid/vla-runtime"
BUGTRACKER = "https://example.invalid/vla-runtime/issues"
SECTION = "robotics"
# vlad itself; the crates linked statically into it keep their own licenses (mostly
# MIT / Apache-2.0, listed by the crate sources in the recipe's WORKDIR).
LICENSE = "Apache-2.0"
# The repository declares Apache-2.0 in its Cargo.toml and ships no license text of its
# own, so the checksum is taken over oe-core's copy of the SPDX text.
# nooelint: oelint.var.licenseremotefile
LIC_FILES_CHKSUM = "file://${COMMON_LICENSE_DIR}/Apache-2.0;md5=89aea4e17d99a7cacdbeed46a0096b10"

require conf/vla-defaults.inc

# Sources: the checkout that carries this layer (meta-vla/ sits at the repository root),
# so the image always holds the runtime the layer was committed with. Only the paths the
# build needs are listed: the root also holds a Python venv and cargo's target/, which
# must not be checksummed at parse time. To build a tagged release from git instead, set
# in local.conf:
#   VLAD_SRC_URI:pn-vlad = "git://<server>/vla-runtime.git;protocol=https;branch=main"
#   SRCREV:pn-vlad = "<commit>"
# The sources sit outside the layer, so the recipe itself (not a bbappend) extends
# FILESPATH to the repository root.
# nooelint: oelint.vars.fileextrapaths, oelint.vars.outofcontext
FILESEXTRAPATHS:prepend := "${THISDIR}/../../..:"
VLAD_SRC_URI ?= "\
    file://Cargo.toml;subdir=${BP} \
    file://Cargo.lock;subdir=${BP} \
    file://runtime;subdir=${BP} \
    file://config/vlad.json;subdir=${BP} \
    file://systemd;subdir=${BP} \
"
SRC_URI = "${VLAD_SRC_URI}"
# crate://crates.io entries for every registry package in Cargo.lock, generated offline by
# scripts/gen_crates_inc.py (CI fails when it is stale).
require vlad-crates.inc

inherit cargo cargo-update-recipe-crates features_check systemd useradd

# Type=notify service, tmpfiles.d and the OTA units all need systemd as the init manager.
REQUIRED_DISTRO_FEATURES = "systemd"

# The workspace root holds Cargo.toml (virtual manifest) and Cargo.lock; the daemon is the
# member runtime/vlad. Building through the member's manifest builds only that package;
# --bin keeps cargo_do_install from picking up any other executable.
CARGO_SRC_DIR = "runtime/vlad"
CARGO_LOCK_PATH = "${S}/Cargo.lock"
CARGO_LOCK_SRC_DIR = "${S}"
CARGO_BUILD_FLAGS:append = " --package vlad --bin vlad"
# The workspace's release profile strips the binary; packaging must strip and split the
# debug info itself (and QA refuses already-stripped binaries).
export CARGO_PROFILE_RELEASE_STRIP = "false"

USERADD_PACKAGES = "${PN}"
# fastrpc is also created by meta-qcom's fastrpc recipe (the group its udev rules grant the
# DSP device nodes to); useradd skips a group that already exists.
GROUPADD_PARAM:${PN} = "--system vla; --system fastrpc; --system vla-robot"
USERADD_PARAM:${PN} = "--system --home-dir ${localstatedir}/lib/vla --no-create-home \
                       --shell ${base_sbindir}/nologin --gid vla --groups fastrpc vla"

SYSTEMD_PACKAGES = "${PN}"
# Started at boot: the daemon (it commits a trial itself). The OTA oneshots run on demand;
# scripts/check_recipe_install.py checks that every unit named here is installed.
SYSTEMD_SERVICE:${PN} = "vlad.service"
VLAD_ONDEMAND_UNITS = "\
    vla-ota-activate@.service \
    vla-ota-commit.service \
    vla-ota-install@.service \
    vla-ota-rollback.service \
"

# The Ed25519 public keys (64 lowercase hex characters each, space separated) vlad trusts
# to sign bundles, written into ota.trusted_keys of the installed vlad.json. vlad verifies
# the current bundle at every start and trusts nothing when the list is empty.
VLA_OTA_TRUSTED_KEYS ?= ""
# How many distinct trusted keys must have signed a bundle (ota.signature_threshold).
VLA_OTA_SIGNATURE_THRESHOLD ?= "1"
# The fleet's offline root keys (ota.root_keys): a key list they signed rotates and revokes
# the signing keys over the air (docs/security.md). Empty: key lists are not read.
VLA_OTA_ROOT_KEYS ?= ""

python vlad_set_trusted_keys() {
    import json
    import re

    keys = (d.getVar('VLA_OTA_TRUSTED_KEYS') or '').split()
    roots = (d.getVar('VLA_OTA_ROOT_KEYS') or '').split()
    # Keys whose secret is published (RFC 8032's test vectors): the list vlad itself
    # refuses at start, from the same file.
    published_path = d.expand('${S}/runtime/crates/vla-ota/published-keys.txt')
    with open(published_path, encoding='utf-8') as published_file:
        published = dict(line.split(' ', 1) for line in published_file.read().splitlines() if line)
    for var, values in (('VLA_OTA_TRUSTED_KEYS', keys), ('VLA_OTA_ROOT_KEYS', roots)):
        for key in values:
            if not re.fullmatch(r'[0-9a-f]{64}', key):
                bb.fatal("%s: `%s` is not an Ed25519 public key "
                         "(64 lowercase hex characters)" % (var, key))
            if key in published:
                bb.fatal("%s: `%s` may not be trusted: its secret key is published "
                         "(%s); generate a fleet key with `vlad bundle keygen`" % (var, key, published[key]))
    threshold = d.getVar('VLA_OTA_SIGNATURE_THRESHOLD') or '1'
    if not threshold.isdigit() or not 1 <= int(threshold) <= max(1, len(keys)):
        bb.fatal("VLA_OTA_SIGNATURE_THRESHOLD: `%s` is not a whole number in 1..=%d (the number of "
                 "VLA_OTA_TRUSTED_KEYS)" % (threshold, max(1, len(keys))))
    if not keys:
        bb.warn("VLA_OTA_TRUSTED_KEYS is empty: the image's vlad trusts no bundle signature "
                "and will refuse every bundle, the shipped one included")
        return
    path = d.expand('${D}${sysconfdir}/vla/vlad.json')
    with open(path, encoding='utf-8') as config_file:
        config = json.load(config_file)
    config['ota']['trusted_keys'] = keys
    config['ota']['signature_threshold'] = int(threshold)
    if roots:
        config['ota']['root_keys'] = roots
    with open(path, 'w', encoding='utf-8') as config_file:
        json.dump(config, config_file, indent=2)
        config_file.write('\n')
}
vlad_set_trusted_keys[doc] = "Writes VLA_OTA_TRUSTED_KEYS, VLA_OTA_SIGNATURE_THRESHOLD and VLA_OTA_ROOT_KEYS into the ota section of the installed vlad.json"
do_install[postfuncs] += "vlad_set_trusted_keys"
do_install[vardeps] += "VLA_OTA_TRUSTED_KEYS VLA_OTA_SIGNATURE_THRESHOLD VLA_OTA_ROOT_KEYS VLA_ADSP_LIBRARY_PATH"

do_install:append() {
    install -d ${D}${sysconfdir}/vla
    install -m 0644 ${S}/config/vlad.json ${D}${sysconfdir}/vla/vlad.json

    install -d ${D}${sysconfdir}/default
    printf 'ADSP_LIBRARY_PATH="%s"\n' "${VLA_ADSP_LIBRARY_PATH}" > ${D}${sysconfdir}/default/vlad
    chmod 0644 ${D}${sysconfdir}/default/vlad

    install -d ${D}${systemd_system_unitdir}
    for unit in ${SYSTEMD_SERVICE:${PN}} ${VLAD_ONDEMAND_UNITS}; do
        install -m 0644 ${S}/systemd/$unit ${D}${systemd_system_unitdir}/$unit
    done
    install -d ${D}${nonarch_libdir}/tmpfiles.d
    install -m 0644 ${S}/systemd/vla-tmpfiles.conf ${D}${nonarch_libdir}/tmpfiles.d/vla.conf
}

# /etc/default/vlad is generated from the QAIRT provider and CPUAffinity= is board
# specific, so the package is per machine.
PACKAGE_ARCH = "${MACHINE_ARCH}"

FILES:${PN} += "\
    ${nonarch_libdir}/tmpfiles.d/vla.conf \
    ${systemd_system_unitdir} \
"
CONFFILES:${PN} = "${sysconfdir}/default/vlad ${sysconfdir}/vla/vlad.json"

# Which packages provide libQnnHtp.so/libQnnSystem.so (dlopen'ed from qnn.lib_dir, so no
# shlib dependency is generated) and the v73 skel the DSP loads; see conf/vla-defaults.inc.
RDEPENDS:${PN} += "${VLA_QAIRT_PROVIDER} ${VLA_QAIRT_PROVIDER}-hexagon-v73"
