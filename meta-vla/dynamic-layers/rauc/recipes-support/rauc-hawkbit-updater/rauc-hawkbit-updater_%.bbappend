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

# The fleet's CA certificate (PEM; a path on the build host, as the signing keys' files):
# the one CA the agent trusts for the update server. rauc-hawkbit-updater has no CA-file
# option (curl's compiled-in bundle, oe-core's curl: ${sysconfdir}/ssl/certs/
# ca-certificates.crt), so the drop-in mounts the directory this CA is installed in over
# /etc/ssl/certs in the agent's namespace. Required with DISTRO_FEATURES "vla-rauc".
# nooelint: oelint.vars.noncoreoverride
VLA_HAWKBIT_CA ??= ""

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
        if [ -z "${VLA_HAWKBIT_CA}" ] || [ ! -f "${VLA_HAWKBIT_CA}" ]; then
            bbfatal "VLA_HAWKBIT_CA must name the fleet's CA certificate (PEM), the one CA the agent trusts; it is '${VLA_HAWKBIT_CA}'"
        fi
        grep -q -- '-----BEGIN CERTIFICATE-----' "${VLA_HAWKBIT_CA}" ||
            bbfatal "VLA_HAWKBIT_CA (${VLA_HAWKBIT_CA}) holds no PEM certificate"
        install -d ${D}${sysconfdir}/${BPN}/fleet-ca
        install -m 0644 "${VLA_HAWKBIT_CA}" ${D}${sysconfdir}/${BPN}/fleet-ca/ca-certificates.crt
        install -d ${D}${nonarch_libdir}/tmpfiles.d
        sed 's|@VLA_HAWKBIT_DIR@|${VLA_HAWKBIT_DIR}|g' ${UNPACKDIR}/vla-hawkbit-tmpfiles.conf > ${D}${nonarch_libdir}/tmpfiles.d/vla-hawkbit.conf
        chmod 0644 ${D}${nonarch_libdir}/tmpfiles.d/vla-hawkbit.conf
    fi
}
do_install[vardeps] += "VLA_HAWKBIT_DIR VLA_HAWKBIT_VLA VLA_HAWKBIT_CA"
# A new CA in the same file installs again.
do_install[file-checksums] += "${@(d.getVar('VLA_HAWKBIT_CA') + ':True') if d.getVar('VLA_HAWKBIT_CA') else ''}"

# nooelint: oelint.vars.noncoreoverride
FILES:${PN} += "\
    ${sysconfdir}/${BPN}/fleet-ca/ca-certificates.crt \
    ${libexecdir}/vla/vla-hawkbit-config \
    ${systemd_system_unitdir}/${BPN}.service.d/50-vla.conf \
    ${nonarch_libdir}/tmpfiles.d/vla-hawkbit.conf \
"
