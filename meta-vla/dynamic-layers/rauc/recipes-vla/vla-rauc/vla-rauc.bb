# nooelint: oelint.file.underscores
# (Versioned with the layer: the handler belongs to the vlad it calls.)
SUMMARY = "RAUC handlers that deliver VLA policy bundles shipped as RAUC artifacts to vlad"
DESCRIPTION = "RAUC system handlers for the artifact repository vla-policies: the \
               pre-install handler verifies the policy (vlad bundle verify) before RAUC \
               writes it, the post-install handler installs it into vlad's OTA store by \
               hard links, activates it and waits for the daemon's parity-gate verdict, \
               which becomes the result of the RAUC installation."
HOMEPAGE = "https://example.invalid/vla-runtime"
BUGTRACKER = "https://example.invalid/vla-runtime/issues"
SECTION = "robotics"
LICENSE = "Apache-2.0"
# nooelint: oelint.var.licenseremotefile
LIC_FILES_CHKSUM = "file://${COMMON_LICENSE_DIR}/Apache-2.0;md5=89aea4e17d99a7cacdbeed46a0096b10"

SRC_URI = "\
    file://vla-rauc-handler \
    file://vla-rauc.default \
    file://vla-rauc-tmpfiles.conf \
"
S = "${UNPACKDIR}"

inherit allarch features_check

# The handlers are useless without the system.conf sections the rauc-conf.bbappend adds
# under the same distro feature.
REQUIRED_DISTRO_FEATURES = "vla-rauc"

do_configure[noexec] = "1"
do_compile[noexec] = "1"

# RAUC runs a handler by path, without arguments: the two links name the phase.
do_install() {
    install -d ${D}${libexecdir}/vla
    install -m 0755 ${S}/vla-rauc-handler ${D}${libexecdir}/vla/vla-rauc-handler
    ln -s vla-rauc-handler ${D}${libexecdir}/vla/rauc-pre-install
    ln -s vla-rauc-handler ${D}${libexecdir}/vla/rauc-post-install
    install -d ${D}${sysconfdir}/default
    install -m 0644 ${S}/vla-rauc.default ${D}${sysconfdir}/default/vla-rauc
    install -d ${D}${nonarch_libdir}/tmpfiles.d
    install -m 0644 ${S}/vla-rauc-tmpfiles.conf ${D}${nonarch_libdir}/tmpfiles.d/vla-rauc.conf
}

FILES:${PN} += "${nonarch_libdir}/tmpfiles.d/vla-rauc.conf"
CONFFILES:${PN} = "${sysconfdir}/default/vla-rauc"
# The handler is POSIX sh with awk and grep; RAUC copies a converted (tar-extract) tree
# with cp -a. The system.conf sections come from meta-vla's rauc-conf.bbappend.
RDEPENDS:${PN} = "rauc virtual-rauc-conf vlad"
