# nooelint: oelint.file.underscores
# (No version in the file name: PV is read from the SDK the integrator names.)
SUMMARY = "QNN HTP runtime libraries and Hexagon v73 skel from a local QAIRT SDK"
DESCRIPTION = "Fallback for BSPs without meta-qcom's qairt-sdk: packages the QAIRT \
               libraries vlad dlopens (libQnnHtp, libQnnSystem, the v73 stub), the HTP \
               skel the DSP loads and the QNN headers (for the bundle's version check) \
               from the unpacked SDK in QAIRT_SDK_DIR."
HOMEPAGE = "https://www.qualcomm.com/developer/software/qualcomm-ai-engine-direct-sdk"
BUGTRACKER = "https://example.invalid/vla-runtime/issues"
SECTION = "libs"
# The QAIRT license is a PDF inside the SDK, accepted when the SDK is downloaded; its
# checksum changes with every release, so the recipe does not track it.
LICENSE = "CLOSED"

# libQnnHtpV73Stub.so of older SDKs names the unversioned libcdsprpc.so; fastrpc ships
# only libcdsprpc.so.1, so the DT_NEEDED entry is rewritten (patchelf) to resolve.
DEPENDS = "patchelf-native"

require conf/vla-defaults.inc

QAIRT_SDK_VERSION ?= ""
PV = "${@d.getVar('QAIRT_SDK_VERSION') or '0'}"

# The SDK is used in place (GBs, many host tools we do not ship): nothing is fetched, and
# do_install copies only the files listed below. PV (from the SDK's QnnSdkBuildId.h) and
# the directory are in the task signature, so a different SDK rebuilds the package.
SRC_URI = ""
S = "${UNPACKDIR}"

# What vlad loads on the application processor: the HTP backend, the system library
# (context binary metadata) and the v73 stub that opens the FastRPC session.
QAIRT_LOCAL_LIBS ?= "libQnnHtp.so libQnnSystem.so libQnnHtpV73Stub.so"

# Prebuilt for aarch64 Linux only.
COMPATIBLE_HOST = "aarch64.*-linux"

# Skipping (with the reason show-recipes prints) needs code that runs at parse time; it
# only tests two paths and reads one small header.
# nooelint: oelint.task.noanonpython
python __anonymous() {
    import re

    sdk = d.getVar('QAIRT_SDK_DIR')
    if not sdk:
        raise bb.parse.SkipRecipe("QAIRT_SDK_DIR is not set: point it at an unpacked QAIRT SDK "
                                  "(the directory holding lib/ and include/) or use meta-qcom's qairt-sdk")
    header = os.path.join(sdk, 'include', 'QNN', 'QnnSdkBuildId.h')
    for needed in (header, os.path.join(sdk, 'lib', 'hexagon-v73', 'unsigned')):
        if not os.path.exists(needed):
            raise bb.parse.SkipRecipe("QAIRT_SDK_DIR=%s is not an unpacked QAIRT SDK: %s is missing"
                                      % (sdk, needed))
    # Re-parse when the SDK directory is switched in place (its build id header changes).
    bb.parse.mark_dependency(d, header)
    if not d.getVar('QAIRT_SDK_VERSION'):
        with open(header, encoding='utf-8', errors='replace') as build_id:
            found = re.search(r'#define\s+QNN_SDK_BUILD_ID\s+"v?([0-9][0-9.]*)', build_id.read())
        if not found:
            raise bb.parse.SkipRecipe("%s has no QNN_SDK_BUILD_ID: set QAIRT_SDK_VERSION" % header)
        d.setVar('QAIRT_SDK_VERSION', found.group(1).rstrip('.'))
}

do_configure[noexec] = "1"
do_compile[noexec] = "1"

do_install[vardeps] += "QAIRT_SDK_DIR QAIRT_LOCAL_LIBS VLA_QAIRT_SKEL_DIR"
do_install() {
    # The SDK ships one aarch64 build per GCC release (lib/aarch64-oe-linux-gccN.M): take
    # the newest one that is not newer than the compiler this build uses.
    gcc_major=$(echo "${GCCVERSION}" | sed 's/[^0-9].*//')
    platform_dir=""
    version=$gcc_major
    while [ -z "$platform_dir" ] && [ "$version" -ge 8 ]; do
        for candidate in ${QAIRT_SDK_DIR}/lib/aarch64-oe-linux-gcc$version.*; do
            if [ -d "$candidate" ]; then
                platform_dir="$candidate"
            fi
        done
        version=$(expr $version - 1)
    done
    if [ -z "$platform_dir" ]; then
        bbfatal "QAIRT_SDK_DIR=${QAIRT_SDK_DIR} has no lib/aarch64-oe-linux-gccN.* for GCC <= $gcc_major"
    fi
    bbnote "QAIRT libraries from $platform_dir"

    install -d ${D}${libdir}
    for lib in ${QAIRT_LOCAL_LIBS}; do
        if [ ! -f "$platform_dir/$lib" ]; then
            bbfatal "QAIRT SDK: $platform_dir/$lib is missing"
        fi
        install -m 0755 "$platform_dir/$lib" ${D}${libdir}/$lib
        if ${READELF} -d ${D}${libdir}/$lib | grep -q 'NEEDED.*\[libcdsprpc\.so\]'; then
            patchelf --replace-needed libcdsprpc.so libcdsprpc.so.1 ${D}${libdir}/$lib
        fi
    done

    install -d ${D}${VLA_QAIRT_SKEL_DIR}
    cp -R --no-preserve=ownership ${QAIRT_SDK_DIR}/lib/hexagon-v73/unsigned/. ${D}${VLA_QAIRT_SKEL_DIR}/

    install -d ${D}${includedir}/QNN
    cp -R --no-preserve=ownership ${QAIRT_SDK_DIR}/include/QNN/. ${D}${includedir}/QNN/
}

# Vendor binaries arrive stripped, without debug info to split.
INHIBIT_PACKAGE_STRIP = "1"
INHIBIT_PACKAGE_DEBUG_SPLIT = "1"
# The SDK ships unversioned .so files that are loaded by name (dlopen): keep them in the
# main package instead of splitting them into -dev as development symlinks.
SOLIBS = ".so"
FILES_SOLIBSDEV = ""

PACKAGES =+ "${PN}-hexagon-v73"
FILES:${PN}-hexagon-v73 += "${VLA_QAIRT_SKEL_DIR}"

# Same files as meta-qcom's qairt-sdk in ${libdir}: never both in one image.
RCONFLICTS:${PN} = "qairt-sdk qairt-wheel"

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
