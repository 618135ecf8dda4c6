//! The change between two snapshots: one line per group whose count or bytes changed, as a net
//! delta (a group going from 1 to 2 tensors is `+1`, not a `+2` line and a `-1` line).
use rustc_hash::FxHashMap;

use crate::group::{GroupKey, GroupTotals};

/// Whether a group grew or shrank.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Sign {
    /// `+`: tensors appeared (or the group's bytes grew).
    Plus,
    /// `-`: tensors went away (or the group's bytes shrank).
    Minus,
}

impl Sign {
    /// The log character.
    pub fn as_char(self) -> char {
        match self {
            Sign::Plus => '+',
            Sign::Minus => '-',
        }
    }
}

/// How views, tensors whose storage another tensor owns (they add no memory), show in a diff.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ViewLines {
    /// Folded into the line of the group owning their storage, as a count (`(+2 views)`); a change
    /// of views alone prints nothing.
    #[default]
    Folded,
    /// Lines of their own, `Memory: 0.0 M`, as Pytorch-Memory-Utils prints them.
    Separate,
}

/// One `+`/`-` line: the net change of one group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupChange {
    /// The group.
    pub key: GroupKey,
    /// Direction of the change.
    pub sign: Sign,
    /// Tensors added or removed (absolute value).
    pub count: u64,
    /// Attributed storage bytes added or removed (absolute value).
    pub bytes: u64,
    /// With [`ViewLines::Folded`]: views of the group's storages that came (on a `+` line) or
    /// went (on a `-` line) with it; negative when they moved the other way. 0 otherwise.
    pub views: i64,
}

/// Net per-group changes from `previous` to `current`, largest first, in a stable order.
pub fn diff_groups(
    previous: &FxHashMap<GroupKey, GroupTotals>,
    current: &FxHashMap<GroupKey, GroupTotals>,
    views: ViewLines,
) -> Vec<GroupChange> {
    let folded = views == ViewLines::Folded;
    let mut out = Vec::new();
    let mut push = |key: &GroupKey, before: GroupTotals, after: GroupTotals| {
        if folded && key.view {
            return;
        }
        let dc = after.count as i128 - before.count as i128;
        let db = after.bytes as i128 - before.bytes as i128;
        if dc == 0 && db == 0 {
            return;
        }
        // The count decides the sign; a pure byte change (a view became its storage's owner
        // after the base died) takes the sign of the bytes.
        let sign = if dc > 0 || (dc == 0 && db > 0) { Sign::Plus } else { Sign::Minus };
        let dv = if folded { after.views as i128 - before.views as i128 } else { 0 };
        out.push(GroupChange {
            key: key.clone(),
            sign,
            count: dc.unsigned_abs() as u64,
            bytes: db.unsigned_abs() as u64,
            views: i64::try_from(if sign == Sign::Plus { dv } else { -dv }).unwrap_or(i64::MAX),
        });
    };
    for (key, &now) in current {
        push(key, previous.get(key).copied().unwrap_or_default(), now);
    }
    for (key, &before) in previous {
        if !current.contains_key(key) {
            push(key, before, GroupTotals::default());
        }
    }
    out.sort_by(|a, b| {
        b.bytes
            .cmp(&a.bytes)
            .then(b.count.cmp(&a.count))
            .then((a.sign == Sign::Minus).cmp(&(b.sign == Sign::Minus)))
            .then(a.key.cmp(&b.key))
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::group::{DType, TensorClass};

    fn key(shape: &[i64]) -> GroupKey {
        GroupKey {
            shape: shape.into(),
            dtype: DType::FLOAT32,
            class: TensorClass::Tensor,
            view: false,
            op: None,
            role: None,
        }
    }

    fn table(entries: &[(&[i64], u64, u64)]) -> FxHashMap<GroupKey, GroupTotals> {
        entries.iter().map(|(s, c, b)| (key(s), GroupTotals { count: *c, bytes: *b, views: 0 })).collect()
    }

    fn diff_groups(
        previous: &FxHashMap<GroupKey, GroupTotals>,
        current: &FxHashMap<GroupKey, GroupTotals>,
    ) -> Vec<GroupChange> {
        super::diff_groups(previous, current, ViewLines::Separate)
    }

    #[test]
    fn folded_views_ride_on_their_owners_line_and_alone_print_nothing() {
        let owner = |count, views| GroupTotals { count, bytes: 16 * count, views };
        let view_key = GroupKey { view: true, ..key(&[2, 2]) };
        let before: FxHashMap<_, _> = [(key(&[4]), owner(1, 0))].into_iter().collect();
        let after: FxHashMap<_, _> =
            [(key(&[4]), owner(2, 2)), (view_key.clone(), GroupTotals { count: 2, bytes: 0, views: 0 })]
                .into_iter()
                .collect();
        let d = super::diff_groups(&before, &after, ViewLines::Folded);
        assert_eq!(d, vec![GroupChange { key: key(&[4]), sign: Sign::Plus, count: 1, bytes: 16, views: 2 }]);
        let gone = super::diff_groups(&after, &before, ViewLines::Folded);
        assert_eq!((gone[0].sign, gone[0].views), (Sign::Minus, 2), "the views go with the owner");
        // A new view of a storage already logged: no line.
        let more: FxHashMap<_, _> = [(key(&[4]), owner(1, 3))].into_iter().collect();
        assert!(super::diff_groups(&before, &more, ViewLines::Folded).is_empty());
        // Separate: the view group's own line, no count on the owner's.
        let d = super::diff_groups(&before, &after, ViewLines::Separate);
        let got: Vec<_> = d.iter().map(|c| (c.key.view, c.count, c.bytes, c.views)).collect();
        assert_eq!(got, vec![(false, 1, 16, 0), (true, 2, 0, 0)]);
    }

    #[test]
    fn group_growing_from_one_to_two_is_one_plus_line() {
        let d = diff_groups(&table(&[(&[4], 1, 16)]), &table(&[(&[4], 2, 32)]));
        assert_eq!(d, vec![GroupChange { key: key(&[4]), sign: Sign::Plus, count: 1, bytes: 16, views: 0 }]);
    }

    #[test]
    fn vanished_group_is_a_minus_line_and_order_is_largest_first() {
        let d = diff_groups(&table(&[(&[4], 3, 48), (&[2], 1, 8)]), &table(&[(&[8], 1, 32)]));
        let got: Vec<_> = d.iter().map(|c| (c.sign, c.key.shape.to_vec(), c.count, c.bytes)).collect();
        assert_eq!(
            got,
            vec![(Sign::Minus, vec![4], 3, 48), (Sign::Plus, vec![8], 1, 32), (Sign::Minus, vec![2], 1, 8)]
        );
    }

    #[test]
    fn unchanged_groups_print_nothing_and_byte_only_changes_print_zero_count() {
        assert!(diff_groups(&table(&[(&[4], 1, 16)]), &table(&[(&[4], 1, 16)])).is_empty());
        let d = diff_groups(&table(&[(&[4], 2, 0)]), &table(&[(&[4], 2, 16)]));
        assert_eq!(d[0].sign, Sign::Plus);
        assert_eq!((d[0].count, d[0].bytes), (0, 16));
    }
}
