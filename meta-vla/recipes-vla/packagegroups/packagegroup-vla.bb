SUMMARY = "VLA policy runtime: daemon, QAIRT runtime and the chosen policy bundle"
DESCRIPTION = "Everything the IQ-9075 needs to run the policy named by VLA_POLICY on the \
               NPU at boot. The QAIRT packages come in through vlad's runtime dependencies."
BUGTRACKER = "https://example.invalid/vla-runtime/issues"
SECTION = "robotics"

require conf/vla-defaults.inc

inherit packagegroup

# VLA_BRINGUP_PACKAGES (conf/vla-defaults.inc): the bring-up tools, the ring client library
# and vla-ring-bridge.
RDEPENDS:${PN} = "\
    ${VLA_BRINGUP_PACKAGES} \
    vla-bundle \
    vlad \
"
# With DISTRO_FEATURES "vla-rauc" (meta-rauc builds): the RAUC handlers that deliver
# policies to vlad and the fleet agent that asks the server for them (VLA_UPDATE_AGENT,
# meta-rauc's rauc-hawkbit-updater unless the product brings its own).
# (oelint's dependsordered reads the inline expression's text as one entry.)
# nooelint: oelint.vars.dependsordered
RDEPENDS:${PN} += "${@bb.utils.contains('DISTRO_FEATURES', 'vla-rauc', '${VLA_UPDATE_AGENT} vla-rauc', '', d)}"
