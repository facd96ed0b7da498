# nooelint: oelint.file.underscores
# (No version in the file name: the bundle carries whatever VLA_POLICY names.)
SUMMARY = "RAUC bundle carrying the VLA policy bundle VLA_POLICY as an artifact"
DESCRIPTION = "Builds vla-policy-update-<machine>.raucb: the signed policy bundle named \
               by VLA_POLICY as the artifact [image.vla-policies/policy] (converted with \
               tar-extract so the device verifies it before RAUC writes it), for a fleet \
               server (hawkBit, or any RAUC-driving agent) to roll out. The device's RAUC \
               installs it into the artifact repository and meta-vla's handlers hand it \
               to vlad."
HOMEPAGE = "https://example.invalid/vla-runtime"
BUGTRACKER = "https://example.invalid/vla-runtime/issues"
SECTION = "robotics"
LICENSE = "CLOSED"

# Nothing to fetch: bundle.bbclass collects the policy tar from vla-bundle's deploy.
SRC_URI = ""

require conf/vla-defaults.inc

inherit bundle

# Must equal [system] compatible= of the devices' system.conf (usually set distro-wide).
RAUC_BUNDLE_COMPATIBLE ??= "${MACHINE}"
# The policy's own version (bundle.json `version`, what its signed OTA manifest says):
# what RAUC shows and what a product's [system] min-bundle-version (RAUC 1.14 and later)
# compares. The device's own floor is vlad's: `vlad ota install` in the post-install
# handler refuses a policy below the highest version the device has committed, so RAUC
# fails the install (docs/security.md).
RAUC_BUNDLE_VERSION ??= "${@vla_policy_version(d)}"
RAUC_BUNDLE_DESCRIPTION ??= "VLA policy ${VLA_POLICY}"
# Artifacts exist only in verity bundles.
RAUC_BUNDLE_FORMAT = "verity"

RAUC_BUNDLE_SLOTS = "vla-policies/policy"
RAUC_SLOT_vla-policies/policy = "vla-bundle"
RAUC_SLOT_vla-policies/policy[type] = "file"
RAUC_SLOT_vla-policies/policy[file] = "vla-policy-${VLA_POLICY}.tar"
RAUC_SLOT_vla-policies/policy[rename] = "vla-policy.tar"
RAUC_SLOT_vla-policies/policy[convert] = "tar-extract"
# The tar is made by vla-bundle's do_deploy (only run for this recipe).
RAUC_SLOT_vla-policies/policy[depends] = "vla-bundle:do_deploy"

# RAUC_KEY_FILE and RAUC_CERT_FILE: the fleet's RAUC signing key and certificate (set them
# in local.conf or a distro config; never in this layer).

def vla_policy_version(d):
    import json
    import os
    path = os.path.join(d.getVar('VLA_BUNDLE_DIR') or '', d.getVar('VLA_POLICY') or '', 'bundle.json')
    try:
        with open(path, encoding='utf-8') as manifest_file:
            return json.load(manifest_file).get('version') or '0.0.0'
    except (OSError, ValueError, AttributeError):
        return '0.0.0'

# Skipping with a reason needs parse-time code.
# nooelint: oelint.task.noanonpython
python __anonymous() {
    if not d.getVar('VLA_POLICY'):
        raise bb.parse.SkipRecipe("VLA_POLICY is not set: name the policy bundle to ship")
}
