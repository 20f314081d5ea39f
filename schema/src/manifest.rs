//! `lazyvault.json`: what the store is and which format version wrote it.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::SchemaError;

/// File name of the manifest at the root of a store.
pub const MANIFEST_FILE: &str = "lazyvault.json";
/// Value of the manifest's `format` field.
pub const FORMAT_NAME: &str = "lazyvault";
/// The format version this crate writes for stores. Readers accept any
/// minor of a major they know (minor versions only add optional fields) and
/// refuse newer majors. 2.0: the journal segments a checkpoint covers are
/// removed, so a 1.x writer (which rebuilt its index from the journal)
/// would lose records; it refuses a 2.0 store instead (FORMAT.md, "Version
/// changes").
pub const FORMAT_VERSION: FormatVersion = FormatVersion { major: 2, minor: 0 };
/// The oldest major this crate reads; its writer upgrades such a store's
/// manifest to [`FORMAT_VERSION`] when it takes the writer role.
pub const OLDEST_MAJOR: u32 = 1;
/// The format version archives (`.lvz`) declare: their layout did not
/// change in 2.0, so 1.x readers keep reading them.
pub const ARCHIVE_FORMAT_VERSION: FormatVersion = FormatVersion { major: 1, minor: 6 };

/// `MAJOR.MINOR` format version, independent of the package version (as in
/// numpy's `.npy` format).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct FormatVersion {
    /// Incompatible changes: a reader refuses a store of a newer major.
    pub major: u32,
    /// Compatible additions (optional fields) within a major.
    pub minor: u32,
}

impl fmt::Display for FormatVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.major, self.minor)
    }
}

impl FromStr for FormatVersion {
    type Err = SchemaError;
    fn from_str(s: &str) -> Result<Self, SchemaError> {
        let bad = || SchemaError::MalformedVersion(s.to_owned());
        let (major, minor) = s.split_once('.').ok_or_else(bad)?;
        let digits = |p: &str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit());
        if !digits(major) || !digits(minor) {
            return Err(bad());
        }
        Ok(FormatVersion {
            major: major.parse().map_err(|_| bad())?,
            minor: minor.parse().map_err(|_| bad())?,
        })
    }
}

/// The manifest document. Unknown fields are ignored on purpose: a newer
/// minor version may add fields that an older reader can safely skip.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// Always `"lazyvault"`.
    pub format: String,
    /// `MAJOR.MINOR` of the on-disk format.
    pub format_version: String,
    /// Free text naming the writer, e.g. `"lazyvault 0.1.0"`.
    pub created_by: String,
}

impl Manifest {
    /// The manifest this version of lazyvault writes for a new store.
    pub fn new(created_by: impl Into<String>) -> Self {
        Manifest {
            format: FORMAT_NAME.to_owned(),
            format_version: FORMAT_VERSION.to_string(),
            created_by: created_by.into(),
        }
    }

    /// Decodes and checks a manifest: the right format name and a major
    /// version this crate can read.
    pub fn from_json(bytes: &[u8]) -> Result<Self, SchemaError> {
        let manifest: Manifest =
            serde_json::from_slice(bytes).map_err(|e| SchemaError::Malformed {
                what: "manifest",
                detail: e.to_string(),
            })?;
        manifest.check()?;
        Ok(manifest)
    }

    /// Checks the format name and version (a major from [`OLDEST_MAJOR`] to
    /// [`FORMAT_VERSION`]'s).
    pub fn check(&self) -> Result<FormatVersion, SchemaError> {
        if self.format != FORMAT_NAME {
            return Err(SchemaError::WrongFormat {
                found: self.format.clone(),
            });
        }
        let version: FormatVersion = self.format_version.parse()?;
        if version.major < OLDEST_MAJOR {
            return Err(SchemaError::OlderVersion {
                found: version.to_string(),
                oldest: OLDEST_MAJOR,
            });
        }
        if version.major > FORMAT_VERSION.major {
            return Err(SchemaError::UnsupportedVersion {
                found: version.to_string(),
                supported: FORMAT_VERSION.to_string(),
            });
        }
        Ok(version)
    }

    /// Pretty JSON with a trailing newline, as written to `lazyvault.json`.
    pub fn to_json(&self) -> Vec<u8> {
        let mut out = serde_json::to_vec_pretty(self).expect("manifest serializes");
        out.push(b'\n');
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_manifest_round_trips_and_checks() {
        let m = Manifest::new("test");
        let back = Manifest::from_json(&m.to_json()).unwrap();
        assert_eq!(back, m);
        assert_eq!(back.check().unwrap(), FORMAT_VERSION);
    }

    #[test]
    fn newer_minor_is_accepted_and_unknown_fields_ignored() {
        let json = br#"{"format":"lazyvault","format_version":"1.7","created_by":"x","extra":1}"#;
        let m = Manifest::from_json(json).unwrap();
        assert_eq!(m.check().unwrap(), FormatVersion { major: 1, minor: 7 });
    }

    #[test]
    fn newer_major_is_refused() {
        let json = br#"{"format":"lazyvault","format_version":"3.0","created_by":"x"}"#;
        let err = Manifest::from_json(json).unwrap_err();
        assert!(matches!(err, SchemaError::UnsupportedVersion { .. }));
        assert!(err.to_string().contains("3.0"), "{err}");
        // 1.x stores are still read (their writer upgrades them), 0.x not,
        // and a 0.x is not called newer.
        let old = Manifest::from_json(
            br#"{"format":"lazyvault","format_version":"0.9","created_by":"x"}"#,
        )
        .unwrap_err();
        assert!(matches!(old, SchemaError::OlderVersion { .. }), "{old}");
        assert!(old.to_string().contains("older"), "{old}");
        for (version, ok) in [("1.0", true), ("1.6", true), ("2.0", true), ("0.9", false)] {
            let json = format!(
                r#"{{"format":"lazyvault","format_version":"{version}","created_by":"x"}}"#
            );
            assert_eq!(
                Manifest::from_json(json.as_bytes()).is_ok(),
                ok,
                "{version}"
            );
        }
    }

    #[test]
    fn wrong_format_and_bad_versions_are_refused() {
        let json = br#"{"format":"zarr","format_version":"1.0","created_by":"x"}"#;
        assert!(matches!(
            Manifest::from_json(json),
            Err(SchemaError::WrongFormat { .. })
        ));
        for v in ["1", "1.", ".1", "a.b", "1.0.0", "-1.0", "+1.0", ""] {
            assert!(v.parse::<FormatVersion>().is_err(), "{v:?} accepted");
        }
        assert!(Manifest::from_json(b"{").is_err());
    }
}
