SUMMARY = "VLA policy runtime: daemon, QAIRT runtime and the chosen policy bundle"
DESCRIPTION = "Everything the IQ-9075 needs to run the policy named by VLA_POLICY on the \
               NPU at boot. The QAIRT packages come in through vlad's runtime dependencies."
BUGTRACKER = "https://example.invalid/vla-runtime/issues"
SECTION = "robotics"

inherit packagegroup

RDEPENDS:${PN} = "\
    vla-bundle \
    vlad \
"
