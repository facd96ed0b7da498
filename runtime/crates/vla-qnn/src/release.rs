//! QAIRT version coupling: the QNN build a context binary was compiled by (recorded in
//! the binary, `BinaryInfo::build_id`) against the build of the loaded libraries
//! (`QnnLibrary::build_id`), both `v<major>.<minor>.<patch>.<build>`.
//!
//! Expected to load: binaries from the libraries' release or an earlier release of the
//! same major (QAIRT's libraries read binaries of earlier 2.x releases). Not expected:
//! binaries from a newer release than the libraries, or another major. Only running the
//! binary settles it: the golden parity gate on the board.

/// `major.minor.patch` of a QNN build id such as `v2.51.0.260929181845`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct QairtRelease {
    /// `2` of `v2.51.0`.
    pub major: u32,
    /// `51` of `v2.51.0`.
    pub minor: u32,
    /// `0` of `v2.51.0`.
    pub patch: u32,
}

impl QairtRelease {
    /// Parses `v2.51.0.260929181845` (the `v` and the build number are optional).
    pub fn parse(build_id: &str) -> Option<Self> {
        let text = build_id.trim().trim_start_matches('v');
        let mut parts = text.split('.');
        let mut number = || parts.next()?.parse::<u32>().ok();
        Some(Self {
            major: number()?,
            minor: number()?,
            patch: number()?,
        })
    }
}

impl core::fmt::Display for QairtRelease {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// How a binary's QAIRT release relates to the libraries'.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Coupling {
    /// Same `major.minor.patch`: expected to load.
    SameRelease,
    /// The binary is from an earlier release of the same major: expected to load.
    OlderBinary,
    /// The binary is from a newer release (or another major): not expected to load.
    NewerBinary,
    /// One of the two build ids is missing or unreadable.
    Unknown,
}

impl Coupling {
    /// The coupling of a binary built by `binary_build` with libraries of
    /// `library_build` (QNN build ids; `None` when unknown).
    pub fn of(binary_build: Option<&str>, library_build: Option<&str>) -> Self {
        let (Some(b), Some(l)) = (
            binary_build.and_then(QairtRelease::parse),
            library_build.and_then(QairtRelease::parse),
        ) else {
            return Coupling::Unknown;
        };
        if b.major != l.major || b > l {
            Coupling::NewerBinary
        } else if b == l {
            Coupling::SameRelease
        } else {
            Coupling::OlderBinary
        }
    }

    /// Whether the combination is expected to work (the parity gate still decides).
    pub fn expected_to_load(self) -> bool {
        matches!(self, Coupling::SameRelease | Coupling::OlderBinary)
    }

    /// A few words for reports and logs.
    pub fn describe(self) -> &'static str {
        match self {
            Coupling::SameRelease => "binary from the same QAIRT release: expected to load",
            Coupling::OlderBinary => {
                "binary from an earlier QAIRT release: expected to load; the parity gate decides"
            }
            Coupling::NewerBinary => {
                "binary from a newer QAIRT release than the libraries: not expected to load; recompile it or update QAIRT"
            }
            Coupling::Unknown => "QNN build of the binary or the libraries unknown: not checked",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_build_ids() {
        assert_eq!(
            QairtRelease::parse("v2.51.0.260929181845"),
            Some(QairtRelease {
                major: 2,
                minor: 51,
                patch: 0
            })
        );
        assert_eq!(
            QairtRelease::parse("2.47.0"),
            Some(QairtRelease {
                major: 2,
                minor: 47,
                patch: 0
            })
        );
        assert_eq!(QairtRelease::parse("v2.x"), None);
        assert_eq!(QairtRelease::parse(""), None);
    }

    #[test]
    fn couples_binaries_and_libraries() {
        let lib = Some("v2.51.0.260929181845");
        assert_eq!(
            Coupling::of(Some("v2.51.0.250101"), lib),
            Coupling::SameRelease
        );
        assert_eq!(
            Coupling::of(Some("v2.47.0.250627"), lib),
            Coupling::OlderBinary
        );
        assert_eq!(Coupling::of(Some("v2.52.0.1"), lib), Coupling::NewerBinary);
        assert_eq!(Coupling::of(Some("v2.51.1.1"), lib), Coupling::NewerBinary);
        assert_eq!(Coupling::of(Some("v3.0.0.1"), lib), Coupling::NewerBinary);
        assert_eq!(Coupling::of(Some("v1.9.0.1"), lib), Coupling::NewerBinary);
        assert_eq!(Coupling::of(None, lib), Coupling::Unknown);
        assert_eq!(Coupling::of(Some("v2.47.0.1"), None), Coupling::Unknown);
        assert!(Coupling::OlderBinary.expected_to_load());
        assert!(!Coupling::NewerBinary.expected_to_load());
    }
}
