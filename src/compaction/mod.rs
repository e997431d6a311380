//! Log compaction: rewrite what is still live into one base segment that
//! replaces every older segment (DESIGN.md, "Compaction").
//!
//! This module builds and checks the base segment; the store switches to it.
//! It never touches the live index: the state is rebuilt from the sealed
//! segments themselves, so writers and readers go on meanwhile.
//!
//! | step                                   | crash here leaves                  | open then            |
//! |----------------------------------------|------------------------------------|----------------------|
//! | write + sync `B.seg.tmp`               | a temporary file                   | deletes it           |
//! | remove `SNAPSHOT`, sync directory      | no snapshot                        | replays the log      |
//! | rename `B.seg.tmp` -> `B.seg`, sync dir| base `B` and the segments below it | deletes those        |
//! | delete segments below `B`, sync dir    | base `B`                           | nothing to do        |

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use crate::error::{Error, Result};
use crate::format::segment::FileKind;
use crate::format::state::StateEnd;
use crate::index::Index;
use crate::index::expiry::Ttls;
use crate::log::names::{TMP_SUFFIX, segment_file_name};
use crate::recovery;
use crate::state_file::{self, ReadValue, Values};
use crate::storage::{Storage, StorageFile};

/// What a compaction dropped and what it cost.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CompactionReport {
    /// Expired seen event ids the index let go of: `Stats::seen_ids`
    /// falls by this much. Ids that the seen index's merges let go of
    /// earlier are not counted again, though their bytes leave the disk
    /// now (in `dead_bytes`).
    pub seen_ids_dropped: u64,
    /// Expired batch ids the index let go of.
    pub batch_ids_dropped: u64,
    /// Expired tombstones the index let go of.
    pub tombstones_dropped: u64,
    /// Segment files replaced by the base segment.
    pub segments_replaced: u64,
    /// Bytes of the replaced segments that the base segment did not keep.
    pub dead_bytes: u64,
    /// Bytes of the log and the snapshot before and after, not counting
    /// the space the newest segment holds ahead of its records (which a
    /// close gives back).
    pub bytes_before: u64,
    pub bytes_after: u64,
    /// Longest time readers and writers were held back.
    pub pause: Duration,
    /// Wall time of the whole compaction.
    pub duration: Duration,
}

/// A base segment written and checked, not yet in place.
pub(crate) struct Rewritten {
    pub base_id: u32,
    pub tmp_path: PathBuf,
    pub file: Arc<dyn StorageFile>,
    pub map: Bytes,
    /// The state of the base, read back from it: its values refer to the base.
    pub state: Index,
    /// Bytes of the segments the base replaces.
    pub replaced_bytes: u64,
    pub replaced_segments: Vec<u32>,
}

/// Builds the base segment for every segment below `cut` (all sealed),
/// dropping what has expired at `now_ms`, and reads it back to check it.
pub(crate) fn rewrite(
    storage: &dyn Storage,
    dir: &Path,
    ttls: Ttls,
    cut: u32,
    now_ms: u64,
    read_value: ReadValue<'_>,
) -> Result<Rewritten> {
    let (mut state, replaced) = recovery::state_before(storage, dir, ttls, cut)?;
    state.purge_expired(now_ms);
    // The base settles its add marks at its own clock (`state_file::write`),
    // which must not be earlier than the purge.
    state.log_time_ms = state.log_time_ms.max(now_ms);
    let base_id = cut
        .checked_sub(1)
        .expect("a cut follows at least one segment");
    let tmp_path = dir.join(format!("{}{TMP_SUFFIX}", segment_file_name(base_id)));
    let end = StateEnd {
        covered_segment: base_id,
        first_segment: base_id,
        ..StateEnd::default()
    };
    let file = state_file::write(
        storage,
        &tmp_path,
        FileKind::Base,
        base_id,
        &state,
        &Values::Inline(read_value),
        end,
    )?;
    drop(state);
    file.sync_data()
        .map_err(|e| Error::io("sync", &tmp_path, e))?;

    // Read the base back with the loader `open` uses: a base that would not
    // load is never put in place.
    let map = file.map(0).map_err(|e| Error::io("map", &tmp_path, e))?;
    let loaded = recovery::load_base(file.as_ref(), &map, base_id, ttls).map_err(|reason| {
        Error::Corruption {
            segment: u64::from(base_id),
            file: tmp_path.display().to_string(),
            offset: 0,
            reason: format!("a base segment just written does not load: {reason}"),
        }
    })?;
    let replaced_bytes = replaced.iter().map(|&(_, len)| len).sum();
    Ok(Rewritten {
        base_id,
        tmp_path,
        file,
        map,
        state: loaded,
        replaced_bytes,
        replaced_segments: replaced.into_iter().map(|(id, _)| id).collect(),
    })
}
