//! The Durable Objects placed on this machine and how long each may be
//! served: the agent's side of the control plane's placement lease.
//!
//! The control plane moves an object away from its machine only after the
//! machine has been silent for longer than the lease, counted from when it
//! *received* the machine's last call. The agent counts the same lease from
//! when it *sent* a call that confirmed the object is still here, so its
//! count always ends first: it stops serving an object before any other
//! machine may be given it. Two calls confirm an object:
//!
//! - a `PlaceDurableObject` answer naming this machine as the owner;
//! - an acknowledged heartbeat that listed the object and whose answer does
//!   not name it among the objects now placed elsewhere. (Objects it does
//!   name are dropped; an object placed here after the heartbeat was sent
//!   was not listed, so that heartbeat does not extend it.)
//!
//! An object whose lease ran out is *fenced*: kept (its state lives in its
//! isolate) but not served until a call confirms it again, or dropped when
//! the control plane says it now lives elsewhere.
//!
//! [`Leases`] is the bookkeeping alone, generic over what is kept per object,
//! so its rules are tested without isolates.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::Hash;
use std::time::{Duration, Instant};

/// Objects by key (the agent's is (account, script, namespace, id)), with
/// their placement and lease.
#[derive(Debug)]
pub struct Leases<K, T> {
    objects: HashMap<K, Entry<T>>,
}

#[derive(Debug)]
struct Entry<T> {
    value: T,
    /// The placement this copy belongs to (the control plane's
    /// `placed_at_ms`, which changes with every new placement).
    placed_at_ms: i64,
    /// Served while `now < until`.
    until: Instant,
}

/// What the table says about one object at one moment.
#[derive(Debug, PartialEq, Eq)]
pub enum Lookup<'a, T> {
    /// Placed here and leased: serve it, and start nothing after `until`.
    Serving {
        /// What is kept for the object.
        value: &'a T,
        /// When its lease runs out unless confirmed again.
        until: Instant,
    },
    /// Placed here once, but the lease ran out: ask the control plane.
    Fenced,
    /// Not here.
    Absent,
}

impl<K, T> Default for Leases<K, T> {
    fn default() -> Self {
        Leases {
            objects: HashMap::new(),
        }
    }
}

impl<K: Hash + Eq + Clone, T> Leases<K, T> {
    /// Whether `key` may be served at `now`.
    pub fn lookup<Q>(&self, key: &Q, now: Instant) -> Lookup<'_, T>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        match self.objects.get(key) {
            None => Lookup::Absent,
            Some(e) if now < e.until => Lookup::Serving {
                value: &e.value,
                until: e.until,
            },
            Some(_) => Lookup::Fenced,
        }
    }

    /// The value kept for `key`, leased or not.
    pub fn get_mut<Q>(&mut self, key: &Q) -> Option<&mut T>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.objects.get_mut(key).map(|e| &mut e.value)
    }

    /// The control plane answered a call sent at `sent` saying `key` lives
    /// here under placement `placed_at_ms`, with a lease of `length`. The
    /// copy kept for that placement is leased until `sent + length` (never
    /// shortened); a copy of another placement, or none, is replaced by
    /// `fresh()`. Returns the value to serve and until when, and the copy
    /// replaced, if any.
    pub fn confirm<Q, E>(
        &mut self,
        key: &Q,
        placed_at_ms: i64,
        sent: Instant,
        length: Duration,
        fresh: impl FnOnce() -> Result<T, E>,
    ) -> Result<(&T, Instant, Option<T>), E>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let until = sent + length;
        let replaced = match self.objects.get(key) {
            Some(e) if e.placed_at_ms == placed_at_ms => None,
            _ => {
                let value = fresh()?;
                self.objects
                    .insert(
                        key.to_owned(),
                        Entry {
                            value,
                            placed_at_ms,
                            until,
                        },
                    )
                    .map(|e| e.value)
            }
        };
        let e = self
            .objects
            .get_mut(key)
            .expect("present: found or just inserted");
        e.until = e.until.max(until);
        Ok((&e.value, e.until, replaced))
    }

    /// A heartbeat sent at `sent` listed `listed` and was acknowledged with
    /// a lease of `length`, naming `elsewhere` as placed on other machines:
    /// drops those (returned) and extends the others that were listed.
    pub fn renewed(
        &mut self,
        listed: &[K],
        elsewhere: &[K],
        sent: Instant,
        length: Duration,
    ) -> Vec<(K, T)> {
        let dropped = elsewhere
            .iter()
            .filter_map(|k| self.objects.remove_entry(k).map(|(k, e)| (k, e.value)))
            .collect();
        for k in listed {
            if let Some(e) = self.objects.get_mut(k) {
                e.until = e.until.max(sent + length);
            }
        }
        dropped
    }

    /// Forgets `key` (the control plane placed it elsewhere).
    pub fn remove<Q>(&mut self, key: &Q) -> Option<T>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.objects.remove(key).map(|e| e.value)
    }

    /// Drops every object `drop` says to, returning them.
    pub fn remove_where(&mut self, mut drop: impl FnMut(&K, &T) -> bool) -> Vec<(K, T)> {
        let keys: Vec<K> = self
            .objects
            .iter()
            .filter(|(k, e)| drop(k, &e.value))
            .map(|(k, _)| k.clone())
            .collect();
        keys.into_iter()
            .filter_map(|k| self.objects.remove(&k).map(|e| (k, e.value)))
            .collect()
    }

    /// Every object kept, leased or fenced.
    pub fn values(&self) -> impl Iterator<Item = &T> {
        self.objects.values().map(|e| &e.value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);
    const LEASE: Duration = Duration::from_secs(4);

    fn confirm(
        t: &mut Leases<String, &'static str>,
        key: &str,
        placed_at: i64,
        sent: Instant,
        fresh: &'static str,
    ) -> (&'static str, Instant, Option<&'static str>) {
        let (v, until, replaced) = t
            .confirm::<str, ()>(key, placed_at, sent, LEASE, || Ok(fresh))
            .unwrap();
        (*v, until, replaced)
    }

    fn state(t: &Leases<String, &'static str>, key: &str, now: Instant) -> Option<&'static str> {
        match t.lookup(key, now) {
            Lookup::Serving { value, .. } => Some(*value),
            Lookup::Fenced => Some("fenced"),
            Lookup::Absent => None,
        }
    }

    #[test]
    fn a_confirmed_object_is_leased_from_the_send_time_of_the_call() {
        let mut t = Leases::default();
        let t0 = Instant::now();
        // Sent at t0, answered at t0 + 3 s: still ends at t0 + lease.
        let (v, until, replaced) = confirm(&mut t, "k", 7, t0, "copy");
        assert_eq!((v, until, replaced), ("copy", t0 + LEASE, None));
        assert_eq!(state(&t, "k", t0 + 3 * S), Some("copy"));
        assert_eq!(
            state(&t, "k", t0 + LEASE - Duration::from_millis(1)),
            Some("copy")
        );
        assert_eq!(
            state(&t, "k", t0 + LEASE),
            Some("fenced"),
            "ends at send + lease"
        );
        assert_eq!(state(&t, "other", t0), None);
    }

    #[test]
    fn fenced_object_confirmed_for_the_same_placement_keeps_its_copy() {
        let mut t = Leases::default();
        let t0 = Instant::now();
        confirm(&mut t, "k", 7, t0, "first");
        assert_eq!(state(&t, "k", t0 + 5 * S), Some("fenced"));
        // The control plane still has it here, same placement: the state
        // survives a lapse (a paused agent, a control plane restart).
        let (v, until, replaced) = confirm(&mut t, "k", 7, t0 + 5 * S, "second");
        assert_eq!((v, until, replaced), ("first", t0 + 5 * S + LEASE, None));
        assert_eq!(state(&t, "k", t0 + 6 * S), Some("first"));
    }

    #[test]
    fn a_new_placement_replaces_the_old_copy() {
        let mut t = Leases::default();
        let t0 = Instant::now();
        confirm(&mut t, "k", 7, t0, "old");
        // Placed elsewhere and back here meanwhile: the old state is stale.
        let (v, _, replaced) = confirm(&mut t, "k", 9, t0 + 6 * S, "new");
        assert_eq!((v, replaced), ("new", Some("old")));
    }

    #[test]
    fn late_answers_never_shorten_a_lease() {
        let mut t = Leases::default();
        let t0 = Instant::now();
        confirm(&mut t, "k", 7, t0 + 2 * S, "copy");
        let (_, until, _) = confirm(&mut t, "k", 7, t0, "copy");
        assert_eq!(until, t0 + 2 * S + LEASE);
        t.renewed(&["k".into()], &[], t0 + S, LEASE);
        assert_eq!(
            state(&t, "k", t0 + 2 * S + LEASE - Duration::from_millis(1)),
            Some("copy")
        );
    }

    #[test]
    fn a_heartbeat_extends_only_what_it_listed_and_drops_what_moved() {
        let mut t = Leases::default();
        let t0 = Instant::now();
        confirm(&mut t, "listed", 1, t0, "a");
        confirm(&mut t, "moved", 1, t0, "b");
        // Placed here after the heartbeat was sent: not listed in it.
        confirm(&mut t, "later", 1, t0, "c");
        let dropped = t.renewed(
            &["listed".into(), "moved".into()],
            &["moved".into()],
            t0 + 3 * S,
            LEASE,
        );
        assert_eq!(dropped, vec![("moved".to_owned(), "b")]);
        let at = t0 + 5 * S;
        assert_eq!(
            state(&t, "listed", at),
            Some("a"),
            "extended to 3 s + lease"
        );
        assert_eq!(state(&t, "moved", at), None, "dropped, never served again");
        assert_eq!(
            state(&t, "later", at),
            Some("fenced"),
            "not extended by a heartbeat that did not list it"
        );
    }

    #[test]
    fn a_heartbeat_sent_after_a_lapse_confirms_what_it_listed() {
        let mut t = Leases::default();
        let t0 = Instant::now();
        confirm(&mut t, "k", 1, t0, "copy");
        assert_eq!(state(&t, "k", t0 + 10 * S), Some("fenced"));
        // Heard again and not placed elsewhere: the control plane cannot
        // move it for a lease from when it heard this heartbeat.
        t.renewed(&["k".into()], &[], t0 + 10 * S, LEASE);
        assert_eq!(state(&t, "k", t0 + 11 * S), Some("copy"));
    }
}
