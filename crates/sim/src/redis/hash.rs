//! A Redis hash, kept in insertion order.
//!
//! Redis stores small hashes (up to 128 fields of up to 64 bytes) as a listpack: fields in
//! insertion order, updated in place. `HGETALL` on a real server returns them in that order, so a vector of pairs with linear lookup is both
//! the faithful and the fast choice at rate-limiter sizes. Past those limits Redis switches to
//! a hash table whose order is arbitrary; tests must not compare `HGETALL` order there.

use bytes::Bytes;

/// Fields and values in insertion order; field names are unique.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Hash {
    fields: Vec<(Bytes, Bytes)>,
}

impl Hash {
    /// Sets `field`, in place if it exists, else at the end; whether it is new.
    pub fn set(&mut self, field: &Bytes, value: &Bytes) -> bool {
        match self.fields.iter_mut().find(|(f, _)| f == field) {
            Some((_, slot)) => {
                *slot = value.clone();
                false
            }
            None => {
                self.fields.push((field.clone(), value.clone()));
                true
            }
        }
    }

    /// The value of `field`, if the hash has it.
    pub fn get(&self, field: &[u8]) -> Option<&Bytes> {
        self.fields
            .iter()
            .find(|(f, _)| f.as_ref() == field)
            .map(|(_, v)| v)
    }

    /// Removes `field`, keeping the others in their order (as a listpack does); whether it
    /// was there.
    pub fn remove(&mut self, field: &[u8]) -> bool {
        match self.fields.iter().position(|(f, _)| f.as_ref() == field) {
            Some(at) => {
                self.fields.remove(at);
                true
            }
            None => false,
        }
    }

    /// How many fields it holds.
    pub fn len(&self) -> usize {
        self.fields.len()
    }

    /// `true` when it holds no field (Redis then deletes its key).
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
    fn updates_keep_their_position() {
        let mut h = Hash::default();
        let b = |s: &'static str| Bytes::from_static(s.as_bytes());
        for f in ["a", "b", "c"] {
            h.set(&b(f), &b("1"));
        }
        h.set(&b("a"), &b("2"));
        let order: Vec<_> = h.iter().map(|(f, v)| (f.clone(), v.clone())).collect();
        assert_eq!(
            order,
            [(b("a"), b("2")), (b("b"), b("1")), (b("c"), b("1"))]
        );
    }

    #[test]
    fn removing_a_field_keeps_the_others_in_order() {
        let mut h = Hash::default();
        let b = |s: &'static str| Bytes::from_static(s.as_bytes());
        for f in ["a", "b", "c"] {
            h.set(&b(f), &b(f));
        }
        assert!(h.remove(b"b") && !h.remove(b"b"));
        assert_eq!(h.get(b"c"), Some(&b("c")));
        assert_eq!(h.get(b"b"), None);
        assert_eq!(h.len(), 2);
        h.set(&b("b"), &b("2"));
        let order: Vec<_> = h.iter().map(|(f, _)| f.clone()).collect();
        assert_eq!(order, [b("a"), b("c"), b("b")]);
        assert!(h.remove(b"a") && h.remove(b"c") && h.remove(b"b") && h.is_empty());
    }
}
