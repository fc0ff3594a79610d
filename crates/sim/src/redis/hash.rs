//! A Redis hash, kept in insertion order.
//!
//! Redis stores small hashes (up to 128 fields of up to 64 bytes) as a listpack: fields in
//! insertion order, updated in place, removed without reordering the rest. `HGETALL` on a
//! real server returns them in that order, so a vector of pairs with linear lookup is both
//! the faithful and the fast choice at rate-limiter sizes. Past those limits Redis switches to
//! a hash table whose order is arbitrary; tests must not compare `HGETALL` order there.

use bytes::Bytes;

/// Fields and values in insertion order; field names are unique.
#[derive(Clone, Debug, Default)]
pub struct Hash {
    fields: Vec<(Bytes, Bytes)>,
}

impl Hash {
    /// The value of `field`.
    pub fn get(&self, field: &[u8]) -> Option<&Bytes> {
        self.fields.iter().find(|(f, _)| f == field).map(|(_, v)| v)
    }

    /// Sets `field`; whether it is new.
    pub fn set(&mut self, field: &Bytes, value: Bytes) -> bool {
        match self.fields.iter_mut().find(|(f, _)| f == field) {
            Some((_, slot)) => {
                *slot = value;
                false
            }
            None => {
                self.fields.push((field.clone(), value));
                true
            }
        }
    }

    /// Removes `field`; whether it was there.
    pub fn remove(&mut self, field: &[u8]) -> bool {
        match self.fields.iter().position(|(f, _)| f == field) {
            Some(index) => {
                self.fields.remove(index);
                true
            }
            None => false,
        }
    }

    /// Number of fields.
    pub fn len(&self) -> usize {
        self.fields.len()
    }

    /// Whether there are no fields (the key must then be deleted).
    pub fn is_empty(&self) -> bool {
        self.fields.is_empty()
    }

    /// Fields and values in insertion order.
    pub fn iter(&self) -> impl Iterator<Item = (&Bytes, &Bytes)> {
        self.fields.iter().map(|(f, v)| (f, v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn updates_keep_position_and_removals_keep_the_rest_in_order() {
        let mut h = Hash::default();
        for f in ["a", "b", "c"] {
            assert!(h.set(
                &Bytes::copy_from_slice(f.as_bytes()),
                Bytes::from_static(b"1")
            ));
        }
        assert!(!h.set(&Bytes::from_static(b"a"), Bytes::from_static(b"2")));
        assert!(h.remove(b"b"));
        assert!(h.set(&Bytes::from_static(b"b"), Bytes::from_static(b"3")));
        let order: Vec<_> = h.iter().map(|(f, v)| (f.to_vec(), v.to_vec())).collect();
        assert_eq!(
            order,
            [
                (b"a".to_vec(), b"2".to_vec()),
                (b"c".to_vec(), b"1".to_vec()),
                (b"b".to_vec(), b"3".to_vec())
            ]
        );
    }
}
