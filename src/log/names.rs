//! Segment id <-> file name. Segment files are `NNNNNNNNNN.seg` (ten decimal
//! digits), so name order is log order.

/// File name of the directory lock.
pub(crate) const LOCK_FILE: &str = "LOCK";

/// File name of the index snapshot.
pub(crate) const SNAPSHOT_FILE: &str = "SNAPSHOT";

/// Left by a store whose sync failed: the next open rewrites the newest segment.
pub(crate) const SYNC_FAILED_FILE: &str = "SYNC_FAILED";

/// Left in a store directory that open created, until the parents of the
/// directories it created are synced: how many levels, from the store's up.
pub(crate) const PARENTS_UNSYNCED_FILE: &str = "PARENTS_UNSYNCED";

/// Suffix of a file being written, renamed into place once whole and synced.
pub(crate) const TMP_SUFFIX: &str = ".tmp";

/// File name of segment `id`.
pub(crate) fn segment_file_name(id: u32) -> String {
    format!("{id:010}.seg")
}

/// The segment id a file name stands for, if it is a segment file name.
/// Ids start at 1: `0000000000.seg` is no segment (and is ignored).
pub(crate) fn parse_segment_file_name(name: &str) -> Option<u32> {
    let digits = name.strip_suffix(".seg")?;
    if digits.len() != 10 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok().filter(|&id| id > 0)
}

/// Whether `name` is a temporary file the store writes (a segment's copy
/// or a base being built, `SNAPSHOT.tmp`): what open and repair may delete.
/// Other `.tmp` files in the directory are not the store's to touch.
pub(crate) fn is_own_temporary(name: &str) -> bool {
    name.strip_suffix(TMP_SUFFIX)
        .is_some_and(|stem| stem == SNAPSHOT_FILE || parse_segment_file_name(stem).is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_sort_in_log_order() {
        assert_eq!(segment_file_name(12), "0000000012.seg");
        assert_eq!(parse_segment_file_name("0000000012.seg"), Some(12));
        assert_eq!(
            parse_segment_file_name(&segment_file_name(u32::MAX)),
            Some(u32::MAX)
        );
        for bad in [
            "0000000000.seg",
            "12.seg",
            "000000001a.seg",
            "0000000012.log",
            "LOCK",
            "0000000012.seg.tmp",
            // Ten characters that `str::parse` takes for 12: a sign is no
            // digit, and this file would stand in for `0000000012.seg`.
            "+000000012.seg",
        ] {
            assert_eq!(parse_segment_file_name(bad), None, "{bad}");
        }
        assert!(segment_file_name(9) < segment_file_name(10));
    }

    #[test]
    fn only_the_stores_own_temporaries_are_its_own() {
        for own in ["0000000012.seg.tmp", "SNAPSHOT.tmp"] {
            assert!(is_own_temporary(own), "{own}");
        }
        for other in [
            "report.tmp",
            "12.seg.tmp",
            "SNAPSHOT.old.tmp",
            "my-SNAPSHOT.tmp",
            "SNAPSHOT",
            "0000000012.seg",
            ".tmp",
        ] {
            assert!(!is_own_temporary(other), "{other}");
        }
    }
}
