//! Semantic versions of bundles and the runtime (`version`, `min_runtime_version`): parsed
//! by the `semver` crate, compared by SemVer 2.0 precedence (build metadata ignored, a
//! pre-release sorts before its release), which is what "at least this runtime" means.

use std::cmp::Ordering;

/// A parsed `MAJOR.MINOR.PATCH[-pre][+build]`.
#[derive(Clone, Debug)]
pub struct Version(semver::Version);

impl Version {
    /// Parses `text`; `None` if it is not a semantic version (leading zeros, empty
    /// identifiers and missing parts are refused).
    pub fn parse(text: &str) -> Option<Version> {
        semver::Version::parse(text).ok().map(Version)
    }
}

impl PartialEq for Version {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Version {}

impl Ord for Version {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.cmp_precedence(&other.0)
    }
}

impl PartialOrd for Version {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &str) -> Version {
        Version::parse(s).unwrap_or_else(|| panic!("{s} should parse"))
    }

    #[test]
    fn precedence_follows_semver() {
        let ordered = [
            "0.1.0",
            "0.9.0",
            "0.10.0",
            "1.0.0-alpha",
            "1.0.0-alpha.1",
            "1.0.0-alpha.beta",
            "1.0.0-beta.2",
            "1.0.0-beta.11",
            "1.0.0-rc.1",
            "1.0.0",
            "1.0.1",
            "2.0.0",
        ];
        for pair in ordered.windows(2) {
            assert!(v(pair[0]) < v(pair[1]), "{} < {}", pair[0], pair[1]);
        }
        assert_eq!(v("1.2.3+build.5"), v("1.2.3"));
    }

    #[test]
    fn rejects_malformed() {
        for bad in [
            "",
            "1",
            "1.2",
            "1.2.3.4",
            "01.2.3",
            "1.2.x",
            "1.2.3-",
            "1.2.3-a..b",
            "1.2.3+",
        ] {
            assert!(Version::parse(bad).is_none(), "{bad:?} should be rejected");
        }
    }
}
