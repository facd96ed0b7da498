SUMMARY = "C ring client library of the VLA runtime and the vla-ring-bridge board tool"
DESCRIPTION = "The C side of vlad's shared-memory rings: vla_ring.h (the ABI), \
               vla_ring_client.h and libvla_ring_client (open, flock, size check and \
               mmap of a ring file; the observation writer, the instruction segment's \
               writer, the action reader) for robot firmware, and vla-ring-bridge, those \
               ring ends on stdin/stdout for bring-up: a simulator on a workstation drives \
               the board's vlad through `ssh board vla-ring-bridge ...`."
HOMEPAGE = "https://example.invalid/vla-runtime"
BUGTRACKER = "https://example.invalid/vla-runtime/issues"
SECTION = "robotics"
LICENSE = "Apache-2.0"
# nooelint: oelint.var.licenseremotefile
LIC_FILES_CHKSUM = "file://${COMMON_LICENSE_DIR}/Apache-2.0;md5=89aea4e17d99a7cacdbeed46a0096b10"

# Sources: the checkout that carries this layer, as for vlad (the ring ABI header and the
# library's directory only).
# nooelint: oelint.vars.fileextrapaths, oelint.vars.outofcontext
FILESEXTRAPATHS:prepend := "${THISDIR}/../../..:"
SRC_URI = "\
    file://runtime/include;subdir=${BP} \
    file://runtime/ring-c;subdir=${BP} \
"

# runtime/ring-c/Makefile takes CC, CFLAGS and LDFLAGS from the environment bitbake
# exports; ARCH and an empty STATIC keep it from choosing Debian's cross gcc or linking
# the bridge statically (its Debian build for scp does).
EXTRA_OEMAKE = "-C ${S}/runtime/ring-c O=${B}/ring-c ARCH=${TARGET_ARCH} STATIC="

do_compile() {
    oe_runmake
}

do_install() {
    oe_runmake install DESTDIR=${D} BINDIR=${bindir} LIBDIR=${libdir} INCLUDEDIR=${includedir}
}

# The default split: the bridge and libvla_ring_client.so.1 in ${PN}, the headers and the
# .so link in -dev, libvla_ring_client.a in -staticdev.
