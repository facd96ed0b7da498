# meta-vla: meta-rauc's rauc-hawkbit-updater as the fleet agent of a vlad device, with
# DISTRO_FEATURES "vla-rauc" only (without it this append changes nothing). The image
# carries the settings every device shares (HTTPS, downloads on the data partition, no
# reboot after an update) in /etc/rauc-hawkbit-updater/config.conf; the device's identity
# (server, tenant, target name, token) is provisioned per device in
# ${VLA_HAWKBIT_DIR}/device.env, and the service's drop-in writes the configuration it
# runs with from the two at every start (/usr/libexec/vla/vla-hawkbit-config). See
# meta-vla/README.md, "The fleet agent in the image".
# Where the device's provisioned identity (device.env) and the bundle downloads live: a
# directory on the persistent data partition, the one that holds /var/lib/vla. Its default
# is here, not in conf/vla-defaults.inc with the others: this append is its only user, and
# an append that required that file would carry all of meta-vla's settings into
# meta-rauc's recipe.
# nooelint: oelint.vars.noncoreoverride
VLA_HAWKBIT_DIR ??= "${localstatedir}/lib/rauc-hawkbit-updater"

# nooelint: oelint.vars.noncoreoverride
FILESEXTRAPATHS:prepend := "${THISDIR}/files:"
# nooelint: oelint.vars.noncoreoverride
SRC_URI += "\
    file://vla-hawkbit.conf \
    file://vla-hawkbit-config \
    file://vla-hawkbit.service.conf \
    file://vla-hawkbit-tmpfiles.conf \
"

# nooelint: oelint.vars.noncoreoverride
VLA_HAWKBIT_VLA = "${@bb.utils.contains('DISTRO_FEATURES', 'vla-rauc', '1', '0', d)}"

# meta-rauc installs the upstream example (a test server over HTTP, a sample token) as
# config.conf: replaced by the image's shared settings.
# nooelint: oelint.vars.noncoreoverride
do_install:append() {
    if [ "${VLA_HAWKBIT_VLA}" = "1" ]; then
        install -d ${D}${sysconfdir}/${BPN}
        sed 's|@VLA_HAWKBIT_DIR@|${VLA_HAWKBIT_DIR}|g' ${UNPACKDIR}/vla-hawkbit.conf > ${D}${sysconfdir}/${BPN}/config.conf
        chmod 0644 ${D}${sysconfdir}/${BPN}/config.conf
        install -d ${D}${libexecdir}/vla
        install -m 0755 ${UNPACKDIR}/vla-hawkbit-config ${D}${libexecdir}/vla/vla-hawkbit-config
        install -d ${D}${systemd_system_unitdir}/${BPN}.service.d
        sed 's|@VLA_HAWKBIT_DIR@|${VLA_HAWKBIT_DIR}|g' ${UNPACKDIR}/vla-hawkbit.service.conf > ${D}${systemd_system_unitdir}/${BPN}.service.d/50-vla.conf
        chmod 0644 ${D}${systemd_system_unitdir}/${BPN}.service.d/50-vla.conf
        install -d ${D}${nonarch_libdir}/tmpfiles.d
        sed 's|@VLA_HAWKBIT_DIR@|${VLA_HAWKBIT_DIR}|g' ${UNPACKDIR}/vla-hawkbit-tmpfiles.conf > ${D}${nonarch_libdir}/tmpfiles.d/vla-hawkbit.conf
        chmod 0644 ${D}${nonarch_libdir}/tmpfiles.d/vla-hawkbit.conf
    fi
}
do_install[vardeps] += "VLA_HAWKBIT_DIR VLA_HAWKBIT_VLA"

# nooelint: oelint.vars.noncoreoverride
FILES:${PN} += "\
    ${libexecdir}/vla/vla-hawkbit-config \
    ${systemd_system_unitdir}/${BPN}.service.d/50-vla.conf \
    ${nonarch_libdir}/tmpfiles.d/vla-hawkbit.conf \
"
