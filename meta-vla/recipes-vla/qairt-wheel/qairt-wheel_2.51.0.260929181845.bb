SUMMARY = "QNN HTP runtime libraries and Hexagon v73 skel from the onnxruntime-qnn wheel"
DESCRIPTION = "QAIRT's device side without a QAIRT SDK download: the aarch64 libraries vlad \
               dlopens (libQnnHtp, libQnnSystem, the v73 stub) and the HTP skel the cDSP \
               loads, taken from the pinned onnxruntime-qnn 2.7.0 wheel for \
               manylinux_2_34_aarch64, which carries QAIRT 2.51.0.260929181845."
HOMEPAGE = "https://www.qualcomm.com/developer/software/qualcomm-ai-engine-direct-sdk"
BUGTRACKER = "https://example.invalid/vla-runtime/issues"
SECTION = "libs"
# Qualcomm's license for the QAIRT binaries, the PDF shipped inside the wheel (the same
# file, and the same license name, as meta-qcom's qairt-sdk). The wheel's LICENSE (MIT)
# covers the ONNX Runtime plugin, which this recipe does not install.
LICENSE = "LicenseRef-qcom-ai-stack"
LIC_FILES_CHKSUM = "file://Qualcomm_LICENSE.pdf;md5=878b885995f453e328edbcd5a1302306"
NO_GENERIC_LICENSE[LicenseRef-qcom-ai-stack] = "Qualcomm_LICENSE.pdf"
# Nothing is built unless the integrator accepts that license explicitly in local.conf:
#   LICENSE_FLAGS_ACCEPTED += "qcom-ai-stack"
# (otherwise bitbake skips the recipe and names the flag).
LICENSE_FLAGS = "qcom-ai-stack"

# libQnnHtpV73Stub.so names the unversioned libcdsprpc.so; fastrpc ships only
# libcdsprpc.so.1, so the DT_NEEDED entry is rewritten (patchelf), as in qairt-local.
DEPENDS = "patchelf-native"

require conf/vla-defaults.inc

# The wheel, pinned by file name and SHA-256 (scripts/fetch_qairt_aarch64.sh pins the same
# file for CI and the bring-up kit). A wheel is a zip archive: downloadfilename makes the
# fetcher unpack it as one.
QAIRT_WHEEL_FILE = "onnxruntime_qnn-2.7.0-cp311-cp311-manylinux_2_34_aarch64.whl"
# PV is the QAIRT release inside the wheel; the download's name carries the wheel's own
# version (2.7.0), which is just as unique.
# nooelint: oelint.vars.downloadfilename
SRC_URI = "https://files.pythonhosted.org/packages/5f/87/92415d071264e40fa9cd8100e0bac7864a774f2e96ba272c2d485fc6f588/${QAIRT_WHEEL_FILE};downloadfilename=${QAIRT_WHEEL_FILE}.zip"
SRC_URI[sha256sum] = "ad08bbfebd7c07ffe83995418303215f46cb25a89e12676f47ee20c32002eaad"

S = "${UNPACKDIR}/onnxruntime_qnn"

# What vlad loads on the application processor: the HTP backend, the system library
# (context binary metadata) and the v73 stub that opens the FastRPC session.
QAIRT_WHEEL_LIBS ?= "libQnnHtp.so libQnnSystem.so libQnnHtpV73Stub.so"

# Prebuilt for aarch64 Linux only (glibc >= 2.34).
COMPATIBLE_HOST = "aarch64.*-linux"

do_configure[noexec] = "1"
do_compile[noexec] = "1"

do_install[vardeps] += "QAIRT_WHEEL_LIBS VLA_QAIRT_SKEL_DIR"
do_install() {
    install -d ${D}${libdir}
    for lib in ${QAIRT_WHEEL_LIBS}; do
        install -m 0755 ${S}/$lib ${D}${libdir}/$lib
        if ${READELF} -d ${D}${libdir}/$lib | grep -q 'NEEDED.*\[libcdsprpc\.so\]'; then
            patchelf --replace-needed libcdsprpc.so libcdsprpc.so.1 ${D}${libdir}/$lib
        fi
    done
    # The directory the service's ADSP_LIBRARY_PATH names first (VLA_QAIRT_SKEL_DIR).
    install -d ${D}${VLA_QAIRT_SKEL_DIR}
    install -m 0755 ${S}/libQnnHtpV73Skel.so ${D}${VLA_QAIRT_SKEL_DIR}/libQnnHtpV73Skel.so
}

# Vendor binaries arrive stripped, without debug info to split.
INHIBIT_PACKAGE_STRIP = "1"
INHIBIT_PACKAGE_DEBUG_SPLIT = "1"
# Unversioned .so files loaded by name (dlopen): keep them in the main package instead of
# splitting them into -dev as development symlinks.
SOLIBS = ".so"
FILES_SOLIBSDEV = ""

PACKAGES =+ "${PN}-hexagon-v73"
FILES:${PN}-hexagon-v73 += "${VLA_QAIRT_SKEL_DIR}"

# Same files in ${libdir} as the other two providers: never two in one image.
RCONFLICTS:${PN} = "qairt-sdk qairt-local"

# already-stripped: Qualcomm's release builds arrive stripped (see INHIBIT_PACKAGE_STRIP).
# nooelint: oelint.vars.insaneskip
INSANE_SKIP:${PN} += "already-stripped"
# The skel is Hexagon DSP code: its ELF machine is not the target's (arch), it sits in the
# DSP search path rather than a linker path (libdir), it was not linked with our LDFLAGS
# (ldflags), its NEEDED entries resolve on the DSP, not in the image (file-rdeps), and it
# arrives stripped (already-stripped).
# nooelint: oelint.vars.insaneskip
INSANE_SKIP:${PN}-hexagon-v73 += "arch libdir ldflags file-rdeps already-stripped"
SKIP_FILEDEPS:${PN}-hexagon-v73 = "1"
