# meta-vla: with DISTRO_FEATURES "vla-rauc", append the VLA policy artifact repository and
# the vla-rauc handlers to the product's system.conf. Without the feature this append
# changes nothing, so adding meta-vla to a RAUC build alone leaves system.conf as it was.
# A product whose system.conf already has [handlers] sets VLA_RAUC_SYSTEM_CONF = "0" and
# calls the two vla-rauc handlers from its own.
# nooelint: oelint.vars.noncoreoverride
FILESEXTRAPATHS:prepend := "${THISDIR}/files:"
# nooelint: oelint.vars.noncoreoverride
SRC_URI += "file://vla-rauc-system.conf"

# nooelint: oelint.vars.noncoreoverride
VLA_RAUC_SYSTEM_CONF ??= "${@bb.utils.contains('DISTRO_FEATURES', 'vla-rauc', '1', '0', d)}"

# nooelint: oelint.vars.noncoreoverride
do_install:append() {
    if [ "${VLA_RAUC_SYSTEM_CONF}" = "1" ]; then
        conf=${D}${nonarch_libdir}/rauc/system.conf
        if grep -q '^\[handlers\]' $conf; then
            bbfatal "system.conf already has a [handlers] section: set VLA_RAUC_SYSTEM_CONF = \"0\" and call ${libexecdir}/vla/rauc-pre-install and rauc-post-install from your handlers"
        fi
        if grep -q '^\[artifacts\.vla-policies\]' $conf; then
            bbfatal "system.conf already defines [artifacts.vla-policies]: set VLA_RAUC_SYSTEM_CONF = \"0\""
        fi
        cat ${UNPACKDIR}/vla-rauc-system.conf >> $conf
    fi
}
do_install[vardeps] += "VLA_RAUC_SYSTEM_CONF"
