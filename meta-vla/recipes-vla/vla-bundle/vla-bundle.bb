# nooelint: oelint.file.underscores
# (No version in the file name: the bundle is whatever VLA_POLICY names.)
SUMMARY = "The VLA policy bundle named by VLA_POLICY, installed as the first OTA slot"
DESCRIPTION = "Copies the bundle directory VLA_BUNDLE_DIR/VLA_POLICY (bundle.json, QNN \
               HTP context binaries, golden and prompt files) to /var/lib/vla/bundles/<id>/ \
               and points /var/lib/vla/current at it, so vlad runs that policy on first boot."
HOMEPAGE = "https://example.invalid/vla-runtime"
BUGTRACKER = "https://example.invalid/vla-runtime/issues"
SECTION = "robotics"
# The model weights in a bundle carry their authors' license; an integrator shipping a
# licensed model sets LICENSE and LIC_FILES_CHKSUM for it in a vla-bundle.bbappend.
LICENSE = "CLOSED"

# Copies data only: no compiler. The QAIRT provider is staged for its QnnSdkBuildId.h.
INHIBIT_DEFAULT_DEPS = "1"
DEPENDS = "${VLA_QAIRT_PROVIDER}"

require conf/vla-defaults.inc

VLA_BUNDLE_SRC = "${VLA_BUNDLE_DIR}/${VLA_POLICY}"
# Not needed: do_check_qairt_version reads the QNN build from each context binary. When
# set (or bundle.json has "qairt_version"), it must agree with the binaries.
VLA_BUNDLE_QAIRT_VERSION ?= ""
# Digest of the bundle's file list with sizes and mtimes (set at parse time from stat()
# alone: context binaries are GBs and are never read or checksummed while parsing). It is
# in do_install's signature, so a changed bundle is copied again.
VLA_BUNDLE_STAMP = ""

# Context binaries are not fetched (file:// would checksum GBs at parse time and break
# parsing for everyone when a bundle is missing): do_install copies from VLA_BUNDLE_SRC.
SRC_URI = ""
S = "${UNPACKDIR}"

# The skip decision and VLA_BUNDLE_STAMP depend on files outside the layer, which the
# parse cache would not notice: parse this recipe every time (a few stat() calls).
BB_DONT_CACHE = "1"

# vlad's useradd creates the vla user and group the slot is owned by.
inherit useradd
USERADD_DEPENDS = "vlad"

# Skipping (with the reason show-recipes prints) needs code that runs at parse time; it
# reads bundle.json (a few KB) and stat()s the bundle's files, nothing more.
# nooelint: oelint.task.noanonpython
python __anonymous() {
    import hashlib
    import json
    import re

    policy = d.getVar('VLA_POLICY')
    bundle_dir = d.getVar('VLA_BUNDLE_DIR')
    if not policy:
        raise bb.parse.SkipRecipe("VLA_POLICY is not set: name the policy bundle (a directory "
                                  "under VLA_BUNDLE_DIR=%s) in local.conf" % bundle_dir)
    src = d.getVar('VLA_BUNDLE_SRC')
    if not os.path.isdir(src):
        raise bb.parse.SkipRecipe("bundle directory %s (VLA_BUNDLE_DIR/VLA_POLICY) does not exist"
                                  % src)
    manifest_path = os.path.join(src, 'bundle.json')
    try:
        with open(manifest_path, encoding='utf-8') as manifest_file:
            manifest = json.load(manifest_file)
    except (OSError, ValueError) as err:
        raise bb.parse.SkipRecipe("%s is not a readable bundle manifest: %s" % (manifest_path, err))
    if not isinstance(manifest, dict):
        raise bb.parse.SkipRecipe("%s is not a JSON object" % manifest_path)

    for key, want in (('soc_model', d.getVar('VLA_SOC_MODEL')), ('htp_arch', d.getVar('VLA_HTP_ARCH'))):
        have = manifest.get(key)
        if str(have) != want:
            raise bb.parse.SkipRecipe("%s: %s is %r but this machine needs %s (VLA_SOC_MODEL/"
                                      "VLA_HTP_ARCH): the context binaries would not load"
                                      % (manifest_path, key, have, want))

    # vlad verifies the current bundle against its signed OTA manifest at every start and
    # names slots by the manifest's hash, so only a packed bundle can be the first slot.
    if not os.path.isfile(os.path.join(src, 'ota-manifest.json')):
        raise bb.parse.SkipRecipe("%s has no ota-manifest.json: pack (and sign) the bundle for OTA "
                                  "first; vlad verifies it at every start" % src)

    # The package version is the bundle's own, so package feeds tell bundles apart.
    if isinstance(manifest.get('version'), str) and re.match(r'^[0-9][0-9A-Za-z.+~-]*$', manifest['version']):
        d.setVar('PV', manifest['version'])

    if not d.getVar('VLA_BUNDLE_QAIRT_VERSION') and manifest.get('qairt_version'):
        d.setVar('VLA_BUNDLE_QAIRT_VERSION', str(manifest['qairt_version']))

    listing = hashlib.sha256()
    for root, dirs, files in os.walk(src, followlinks=True):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(root, name)
            info = os.stat(path)
            listing.update(("%s %d %d\n" % (os.path.relpath(path, src), info.st_size,
                                           info.st_mtime_ns)).encode())
    d.setVar('VLA_BUNDLE_STAMP', listing.hexdigest())
}

do_configure[noexec] = "1"
do_compile[noexec] = "1"

# Version coupling, derived from the binaries (nobody has to state it): every context
# binary records the QNN build that compiled it (vlad inspect shows it as "QNN build"),
# and the provider's libraries carry theirs. Binaries from the provider's release, or an
# earlier 2.x release, are expected to load (QAIRT's libraries read binaries of earlier
# releases; the board's parity gate settles it, see README); binaries from a newer
# release than the libraries are not, so the build stops here rather than ship an image
# whose daemon fails to warm up on first boot.
python do_check_qairt_version() {
    import json
    import re

    build_re = re.compile(rb'v([0-9]+)\.([0-9]+)\.([0-9]+)\.([0-9]{4,})')

    def release(found):
        return tuple(int(x) for x in found.groups()[:3]), b'.'.join(found.groups()).decode()

    provider = d.getVar('VLA_QAIRT_PROVIDER')
    # The provider's release: its QnnSdkBuildId.h when it stages the headers (an SDK),
    # else the build id inside its libQnnHtp.so (the wheel ships no headers).
    header = os.path.join(d.getVar('STAGING_INCDIR'), 'QNN', 'QnnSdkBuildId.h')
    library = os.path.join(d.getVar('STAGING_LIBDIR'), 'libQnnHtp.so')
    found = None
    for source in (header, library):
        if os.path.isfile(source):
            with open(source, 'rb') as data:
                found = build_re.search(data.read())
            if found:
                break
    if not found:
        bb.fatal("QAIRT provider %s staged neither %s nor a libQnnHtp.so with a QNN build id: "
                 "cannot check the bundle's context binaries against it" % (provider, header))
    provided, provided_id = release(found)

    src = d.getVar('VLA_BUNDLE_SRC')
    policy = d.getVar('VLA_POLICY')
    with open(os.path.join(src, 'bundle.json'), encoding='utf-8') as manifest_file:
        manifest = json.load(manifest_file)
    binaries = []
    def collect(node):
        if isinstance(node, dict):
            for key, value in node.items():
                if key == 'binary' and isinstance(value, str):
                    binaries.append(value)
                else:
                    collect(value)
        elif isinstance(node, list):
            for value in node:
                collect(value)
    collect(manifest.get('components'))
    if not binaries:
        bb.fatal("%s/bundle.json names no context binaries" % src)

    builds = {}
    for rel in sorted(set(binaries)):
        # The build id sits in the binary's header (the first KiB in every binary seen);
        # read 1 MiB, never the whole (GB) file.
        with open(os.path.join(src, rel), 'rb') as data:
            found = build_re.search(data.read(1 << 20))
        if not found:
            bb.fatal("%s: no QNN build id in its first MiB: not a QNN context binary "
                     "(vlad inspect %s says what it is)" % (rel, rel))
        builds[rel] = release(found)

    stated = d.getVar('VLA_BUNDLE_QAIRT_VERSION').lstrip('v')
    for rel, (built, built_id) in sorted(builds.items()):
        if stated and stated.split('.')[:3] != [str(x) for x in built]:
            bb.fatal("VLA_BUNDLE_QAIRT_VERSION (or bundle.json qairt_version) says %s, but %s was "
                     "compiled by QNN %s: drop the setting (the binaries carry their build)"
                     % (stated, rel, built_id))
        if built[0] != provided[0] or built > provided:
            bb.fatal("QAIRT version mismatch: %s of bundle %s was compiled by QNN %s, newer than (or "
                     "another major release from) %s's libraries %s, which are not expected to load "
                     "it; recompile the bundle with QAIRT %s or provide QAIRT %s or later"
                     % (rel, policy, built_id, provider, provided_id,
                        '.'.join(str(x) for x in provided), '.'.join(str(x) for x in built)))
    olders = sorted(rel for rel, (built, _) in builds.items() if built < provided)
    if olders:
        bb.note("bundle %s: %s compiled by an earlier QAIRT than %s %s: expected to load; the "
                "parity gate on the board decides" % (policy, ', '.join(olders), provider, provided_id))
    bb.note("bundle %s: %d context binaries (QNN %s) checked against %s %s"
            % (policy, len(builds), ', '.join(sorted({b for _, b in builds.values()})), provider,
               provided_id))
}
addtask check_qairt_version after do_prepare_recipe_sysroot before do_install
do_check_qairt_version[doc] = "Fails the build when a context binary was compiled by a newer QAIRT than the provider's libraries"
do_check_qairt_version[vardeps] += "VLA_BUNDLE_QAIRT_VERSION VLA_QAIRT_PROVIDER VLA_BUNDLE_STAMP"

# What vlad checks at every start, minus the signature check itself (the keys are in
# vlad.json, see VLA_OTA_TRUSTED_KEYS in the vlad recipe):
# ota-manifest.json names this machine's NPU and lists every file with its size and
# SHA-256. Reads the whole bundle once; a corrupt copy fails here, not on a fleet.
python do_verify_bundle() {
    import hashlib
    import json

    src = d.getVar('VLA_BUNDLE_SRC')
    manifest_path = os.path.join(src, 'ota-manifest.json')
    try:
        with open(manifest_path, encoding='utf-8') as manifest_file:
            manifest = json.load(manifest_file)
        listed = manifest['files']
        target = (str(manifest['soc_model']), str(manifest['htp_arch']))
    except (OSError, ValueError, KeyError, TypeError) as err:
        bb.fatal("%s is not a readable OTA manifest: %r" % (manifest_path, err))
    if target != (d.getVar('VLA_SOC_MODEL'), d.getVar('VLA_HTP_ARCH')):
        bb.fatal("%s targets soc_model %s / htp_arch %s, this machine needs %s / %s"
                 % (manifest_path, target[0], target[1], d.getVar('VLA_SOC_MODEL'), d.getVar('VLA_HTP_ARCH')))
    expected = {}
    for entry in listed:
        try:
            expected[entry['path']] = (int(entry['size']), entry['sha256'])
        except (KeyError, TypeError, ValueError) as err:
            bb.fatal("%s: malformed files[] entry %r: %r" % (manifest_path, entry, err))
    if 'bundle.json' not in expected:
        bb.fatal("%s does not list bundle.json" % manifest_path)

    present = set()
    for root, dirs, files in os.walk(src, followlinks=True):
        for name in files:
            present.add(os.path.relpath(os.path.join(root, name), src).replace(os.sep, '/'))
    unlisted = sorted(present - set(expected) - {'ota-manifest.json', 'ota-manifest.json.sig'})
    if unlisted:
        bb.fatal("%s: files not listed in ota-manifest.json: %s" % (src, ', '.join(unlisted)))
    for rel, (size, sha256) in sorted(expected.items()):
        path = os.path.join(src, rel)
        if rel not in present:
            bb.fatal("%s: %s is listed in ota-manifest.json but missing" % (src, rel))
        if os.path.getsize(path) != size:
            bb.fatal("%s: %s is %d bytes, ota-manifest.json says %d"
                     % (src, rel, os.path.getsize(path), size))
        digest = hashlib.sha256()
        with open(path, 'rb') as data:
            for block in iter(lambda: data.read(1 << 20), b''):
                digest.update(block)
        if digest.hexdigest() != sha256:
            bb.fatal("%s: %s has SHA-256 %s, ota-manifest.json says %s"
                     % (src, rel, digest.hexdigest(), sha256))
    if 'ota-manifest.json.sig' not in present:
        bb.fatal("%s is not signed (no ota-manifest.json.sig): vlad refuses unsigned bundles, "
                 "the image would start with nothing to run" % src)
    bb.note("bundle %s: %d files match ota-manifest.json" % (d.getVar('VLA_POLICY'), len(expected)))
}
addtask verify_bundle before do_install
do_verify_bundle[doc] = "Checks every bundle file against ota-manifest.json (size, SHA-256) and the machine's NPU"
do_verify_bundle[vardeps] += "VLA_BUNDLE_SRC VLA_BUNDLE_STAMP VLA_SOC_MODEL VLA_HTP_ARCH"

# The slot is named by the bundle's content hash, the SHA-256 of its ota-manifest.json,
# exactly as vlad ota install names the slots it creates. With no ota-state.json, vlad
# rebuilds its state from the links at the first start: this bundle is current and
# committed. `current` is relative (bundles/<hash>), the form vlad itself writes.
do_install[vardeps] += "VLA_BUNDLE_SRC VLA_BUNDLE_STAMP"
do_install() {
    bundle_id=$(sha256sum "${VLA_BUNDLE_SRC}/ota-manifest.json" | cut -d' ' -f1)
    state=${D}${localstatedir}/lib/vla
    slot=$state/bundles/$bundle_id

    install -d -m 0750 $state $state/bundles $slot
    # -L: a bundle directory may link to context binaries kept elsewhere on the build host.
    cp -R -L --reflink=auto --no-preserve=ownership "${VLA_BUNDLE_SRC}/." $slot/
    chmod -R u=rwX,g=rX,o= $slot
    ln -s bundles/$bundle_id $state/current
    chown -R vla:vla $state
    bbnote "bundle ${VLA_POLICY} installed as slot $bundle_id"
}

# The bundle as one tar of its contents (the directory's entries, not the directory), for
# meta-vla's vla-policy-update RAUC bundle. Not part of do_build: it runs only when that
# recipe asks for it, so images without RAUC never read the context binaries again.
inherit deploy
do_deploy[vardeps] += "VLA_BUNDLE_SRC VLA_BUNDLE_STAMP"
do_deploy() {
    tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@${SOURCE_DATE_EPOCH} \
        --dereference -C "${VLA_BUNDLE_SRC}" -cf ${DEPLOYDIR}/vla-policy-${VLA_POLICY}.tar .
}
addtask deploy after do_verify_bundle

# Context binaries are data for the NPU of this machine only.
PACKAGE_ARCH = "${MACHINE_ARCH}"
FILES:${PN} += "${localstatedir}/lib/vla"
RDEPENDS:${PN} = "vlad"
