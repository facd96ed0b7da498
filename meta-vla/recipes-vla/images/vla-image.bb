SUMMARY = "IQ-9075 image that runs the VLA policy runtime at boot"
DESCRIPTION = "core-image-base plus packagegroup-vla: the vlad daemon, the QAIRT runtime \
               and the policy bundle named by VLA_POLICY, started by systemd on boot."
BUGTRACKER = "https://example.invalid/vla-runtime/issues"
SECTION = "images"
LICENSE = "MIT"

require conf/vla-defaults.inc

inherit core-image features_check

# vlad is a Type=notify service with tmpfiles.d and timer units.
REQUIRED_DISTRO_FEATURES = "systemd"

# packagegroup-base-extended carries MACHINE_EXTRA_RRECOMMENDS, where meta-qcom's machine
# configuration puts the Hexagon DSP firmware and the QAIRT skel.
IMAGE_INSTALL = "\
    packagegroup-core-boot \
    packagegroup-base-extended \
    packagegroup-vla \
    ${CORE_IMAGE_EXTRA_INSTALL} \
"

# With qairt-local or qairt-wheel, the BSP's own recommendation of meta-qcom's
# qairt-sdk would install a second, conflicting copy of libQnnHtp.so.
BAD_RECOMMENDATIONS += "${@'qairt-sdk qairt-sdk-hexagon-v73' if d.getVar('VLA_QAIRT_PROVIDER') != 'qairt-sdk' else ''}"
